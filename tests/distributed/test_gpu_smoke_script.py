"""``scripts/gpu_smoke.py`` (``paddletrainer.tools.gpu_smoke``) passes on CPU (dry run): a subset of its table, to keep the suite short.

fp16 overflow handling in every layout is checked by test_amp_overflow_every_layout; here the script itself runs end to end
with bf16 O2 under pp2 and sharding stage 3, each resuming the other's async checkpoint.
"""
import subprocess
import sys

from launcher import LOCK, REPO


def test_gpu_smoke_script_passes_on_cpu_in_dry_run_mode(tmp_path):
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_smoke.py"), "--layouts", "pp2", "sharding3",
           "--precisions", "bf16", "--work_dir", str(tmp_path), "--lock", LOCK, "--timeout", "300"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("pp2 |", "sharding3 |"))]
    assert len(rows) == 2 and all(row.endswith("PASS") for row in rows), proc.stdout
    assert "CPU dry run" in proc.stdout and proc.stdout.rstrip().endswith("gpu_smoke: PASS")
