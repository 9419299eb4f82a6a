"""The benchmark scripts run in ``--tiny`` mode and print their tables (no timing is asserted).

Each script runs as a subprocess, the way a user runs it. Multi-process parts: ``bench_pipeline.py`` is one
4-process launch (its whole point); the optional launches of the other scripts (``--dp2``, ``--ranks4``,
``--measure``) are left to the full runs, so this file stays well under three minutes.
"""
from __future__ import annotations

import pytest

from .helpers import REPO, run_script, trainer_ready

SCRIPTS = REPO / "scripts"

pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import")


def _tables(stdout: str) -> list:
    return [line[3:-3] for line in stdout.splitlines() if line.startswith("== ") and line.endswith(" ==")]


def test_bench_overhead_tiny_prints_the_three_way_table_and_targets(tmp_path):
    proc = run_script([SCRIPTS / "bench_overhead.py", "--tiny", "--reps", "1", "--workloads", "ernie-cls"], tmp_path,
                      timeout=300)
    out = proc.stdout
    assert any(t.startswith("Training-loop overhead") for t in _tables(out)), out[-2000:]
    for runner in ("bare", "paddletrainer", "paddlenlp"):
        assert f" {runner} " in out, f"no row for {runner}:\n{out[-2000:]}"
    assert "Targets" in _tables(out)
    assert "paddletrainer >= 0.99x bare" in out


def test_bench_checkpoint_tiny_prints_save_load_and_raw_disk_rows(tmp_path):
    proc = run_script([SCRIPTS / "bench_checkpoint.py", "--tiny", "--dir", tmp_path], tmp_path, timeout=300)
    out = proc.stdout
    assert any(t.startswith("Checkpoint save/load") for t in _tables(out)), out[-2000:]
    for row in ("raw disk write (", "raw disk read (", "save_checkpoint (sync)", "async save: training thread blocked (call + wait)",
                "forward/backward beside the host copy", "load_checkpoint"):
        assert row in out, f"missing row {row!r}:\n{out[-2000:]}"
    assert "async blocking <= 10% of sync save" in out and "load >= 80% of raw read bandwidth" in out


def test_bench_checkpoint_formats_prints_a_row_per_format(tmp_path):
    proc = run_script([SCRIPTS / "bench_checkpoint_formats.py", "--size-mb", "1", "--reps", "1"], tmp_path, timeout=300)
    out = proc.stdout
    assert _tables(out) == ["1 MiB, median of 1"], out[-2000:]
    for row in ("paddle.save / paddle.load (Tensors)", "safetensors.numpy save_file / load_file"):
        assert row in out, f"missing row {row!r}:\n{out[-2000:]}"


def test_cost_model_tiny_prints_memory_and_communication_per_axis(tmp_path):
    proc = run_script([SCRIPTS / "cost_model.py", "--tiny"], tmp_path, timeout=120)
    out = proc.stdout
    tables = _tables(out)
    assert "Per-rank memory (busiest rank)" in tables, out
    assert "Per-rank communication per optimizer step" in tables, out
    for axis in ("dp", "sharding", "tp", "pp"):
        assert any(line.startswith(axis + " ") for line in out.splitlines()), f"no {axis} row:\n{out}"


def test_cost_model_formulas_for_a_7b_layout():
    """The arithmetic itself (no subprocess): Llama-7B has ~6.7e9 parameters; ZeRO stages divide state."""
    import importlib
    import sys

    if str(SCRIPTS) not in sys.path:  # a plain import: its dataclasses need the module in sys.modules
        sys.path.insert(0, str(SCRIPTS))
    cm = importlib.import_module("cost_model")
    c = cm.Config(hidden=4096, layers=32, heads=32, vocab=32000, seq=4096, intermediate=11008)
    assert cm.param_counts(c, cm.Layout())["total"] == pytest.approx(6.74e9, rel=0.01)
    one = cm.memory(c, cm.Layout(global_batch=8, micro_batch=1, dp=8))
    for stage, divided in ((1, {"optimizer"}), (2, {"optimizer", "grads"}), (3, {"optimizer", "grads", "params"})):
        sharded = cm.memory(c, cm.Layout(global_batch=8, micro_batch=1, sharding=8, stage=stage))
        for key in ("params", "grads", "optimizer"):
            expected = one[key] / 8 if key in divided else one[key]
            assert sharded[key] == pytest.approx(expected), (stage, key)
    comm = cm.communication(c, cm.Layout(global_batch=8, micro_batch=1, dp=8))
    assert comm["dp"]["min_wire"] == pytest.approx(2 * 7 / 8 * comm["dp"]["payload"])


def test_cost_model_interleaved_pipeline_shrinks_the_bubble_by_the_chunk_count():
    import importlib
    import sys

    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    cm = importlib.import_module("cost_model")
    c = cm.Config(hidden=4096, layers=32, heads=32, vocab=32000, seq=4096, intermediate=11008)
    plain, chunked = cm.Layout(pp=4, global_batch=8), cm.Layout(pp=4, vpp=2, global_batch=8)
    assert cm.pipeline_bubble(plain) == pytest.approx(3 / (8 + 3))
    assert cm.pipeline_bubble(chunked) == pytest.approx(3 / (2 * 8 + 3))
    assert cm.pipeline_bubble(cm.Layout(global_batch=8)) == 0.0
    # 2·(p·v-1)/p activation sends per micro-batch instead of 2·(p-1)/p; more activations held on stage 0
    ratio = cm.communication(c, chunked)["pp"]["payload"] / cm.communication(c, plain)["pp"]["payload"]
    assert ratio == pytest.approx(7 / 3)
    assert cm.memory(c, chunked)["activations"] > cm.memory(c, plain)["activations"]


@pytest.mark.launch
def test_bench_pipeline_tiny_prints_idle_per_stage_and_the_bubble(tmp_path):
    proc = run_script([SCRIPTS / "bench_pipeline.py", "--tiny"], tmp_path, timeout=400)
    out = proc.stdout
    assert "Pipeline idle time per stage (1F1B)" in _tables(out), out[-2000:]
    assert "(p-1)/(v·m+p-1)" in out
    rows = [line for line in out.splitlines() if line.startswith("4  ")]
    assert len(rows) >= 4, out[-2000:]  # m=4: one row per stage


def test_bench_memory_tiny_prints_every_part_per_rank_and_the_slope(tmp_path):
    """Two tiny sizes, one process and dp2 (the one 2-process launch): a row per rank, parts beside predictions."""
    proc = run_script([SCRIPTS / "bench_memory.py", "--tiny"], tmp_path, timeout=400)
    out = proc.stdout
    tables = _tables(out)
    assert any(t.startswith("Memory per rank") for t in tables), out[-2000:]
    assert "Peak slope per model parameter between the two sizes" in tables, out[-2000:]
    for header in ("baseline MiB", "params MiB meas / pred (ratio)", "optimizer", "comm buffers", "uncounted MiB",
                   "peak GiB", "pred peak GiB"):
        assert header in out, f"no column {header!r}:\n{out[-2000:]}"
    rows = [line.split() for line in out.splitlines() if line.startswith(("single ", "dp2 "))]
    # per size: one row for the single process, two for dp2 (one per rank); then the slope table's 3 rows
    assert sorted((r[0], r[1], r[2]) for r in rows if r[1] in ("tiny", "tiny2")) == sorted(
        [(lay, size, rank) for size in ("tiny", "tiny2") for lay, rank in (("single", "0"), ("dp2", "0"), ("dp2", "1"))])
    assert "launch failed" not in out


def test_cost_model_long_context_rows_sep_and_cp():
    """sep: 8 all-to-alls per layer, (S-1)/S on the wire (the CPU all-gather fill S x that); cp: the ring's K/V
    hops; both divide the activations per rank by the degree and sum the gradients over their ranks."""
    import importlib
    import sys

    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    cm = importlib.import_module("cost_model")
    c = cm.Config(hidden=4096, layers=32, heads=32, vocab=32000, seq=32768, intermediate=11008)
    whole = cm.memory(c, cm.Layout(global_batch=1))["activations"]
    shard = 1 * (32768 // 4) * 4096 * 4  # one rank's [b, s/4, h] fp32 activation
    sep = cm.communication(c, cm.Layout(global_batch=1, sep=4))
    assert sep["sep"]["payload"] == 32 * 8 * shard and sep["sep"]["min_wire"] == pytest.approx(3 / 4 * 32 * 8 * shard)
    assert "wire 96.00 GiB (4x the min)" in sep["sep"]["what"]
    assert sep["dp"]["min_wire"] == pytest.approx(2 * 3 / 4 * sep["dp"]["payload"])  # grads summed over sep
    cp = cm.communication(c, cm.Layout(global_batch=1, cp=4))
    assert cp["cp"]["min_wire"] == 32 * (3 + 3 + 4) * 2 * shard and cp["cp"]["payload"] == 2 * cp["cp"]["min_wire"]
    for lay in (cm.Layout(global_batch=1, sep=4), cm.Layout(global_batch=1, cp=4)):
        assert cm.memory(c, lay)["activations"] == pytest.approx(whole / 4)


def test_bench_memory_long_context_trains_one_process_at_s_2s_4s_and_sep2_cp2_at_4s(tmp_path):
    """The long-context mode at a short --seq: one row per run, each trained, tokens per rank = seq / degree."""
    proc = run_script([SCRIPTS / "bench_memory.py", "--long-context", "--seq", "64", "--steps", "2",
                       "--layouts", "sep2,cp2"], tmp_path, timeout=600)
    out = proc.stdout
    assert any(t.startswith("Long context: peak memory per rank") for t in _tables(out)), out[-2000:]
    rows = [r for r in map(str.split, out.splitlines()) if r[:1] in (["single"], ["sep2"], ["cp2"]) and r[1].isdigit()]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("single", "64", "64", "none", "trained"), ("single", "128", "128", "none", "trained"),
        ("single", "256", "256", "none", "trained"), ("sep2", "256", "128", "none", "trained"),
        ("cp2", "256", "128", "none", "trained")], out[-2000:]


def test_bench_packing_tiny_prints_packed_and_padded_throughput_and_attention_memory(tmp_path):
    proc = run_script([SCRIPTS / "bench_packing.py", "--tiny"], tmp_path, timeout=300)
    out = proc.stdout
    tables = _tables(out)
    assert any(t.startswith("Packed rows vs padded samples") for t in tables), out[-2000:]
    assert any(t.startswith("Attention memory at S=") for t in tables), out[-2000:]
    for row in ("padded (one document per sample)", "packed, attn_mask_startend_row_indices",
                "packed, block-diagonal attention_mask", "CPU FlashMask attention", "math attention + S×S mask"):
        assert row in out, f"missing row {row!r}:\n{out[-2000:]}"


def test_bench_startup_one_process_prints_the_phase_table_of_both_runners(tmp_path):
    proc = run_script([SCRIPTS / "bench_startup.py", "--layouts", "1 process", "--reps", "1"], tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout.split("| layout | phase |", 1)[1]
    for phase in ("import", "topology", "model", "optimizer", "wrap", "first_batch", "first_step", "other", "**total**"):
        assert f"| 1 process | {phase} |" in table, phase
    total = next(line for line in table.splitlines() if "**total**" in line).split("|")
    assert float(total[3].split()[0]) > 0 and float(total[4].split()[0]) > 0 and float(total[6].split()[0]) > 0
