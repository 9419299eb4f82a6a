"""Check that a VisualDL log directory is servable: start `visualdl` on loopback, list what it serves, stop it.

    python scripts/serve_visualdl_check.py --logdir output/runs [--tag train/loss] [--port 0]

Prints every run, its scalar tags and the last point of ``--tag``; exits 1 if the server does not answer or no
run has ``--tag``. Without ``--logdir`` it writes a three-step demo run to a temporary directory first.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request


def _get(base, path):
    with urllib.request.urlopen(base + path, timeout=5) as response:
        return json.load(response)["data"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_demo(logdir):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from paddletrainer.metrics import VisualDLWriter

    writer = VisualDLWriter(os.path.join(logdir, "demo"))
    for step in (1, 2, 3):
        writer.log_scalars({"train/loss": 3.0 - step}, step)
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", help="directory holding runs (default: a temporary demo run)")
    parser.add_argument("--tag", default="train/loss")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the server")
    opts = parser.parse_args()

    logdir = opts.logdir or tempfile.mkdtemp(prefix="vdl-check-")
    if not opts.logdir:
        _write_demo(logdir)
    port = opts.port or _free_port()
    base = f"http://127.0.0.1:{port}"
    visualdl = os.path.join(os.path.dirname(sys.executable), "visualdl")
    proc = subprocess.Popen([visualdl, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + opts.timeout
        runs = None
        while runs is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                runs = _get(base, "/app/api/runs")
            except OSError:
                time.sleep(0.2)
        if runs is None:
            print(f"visualdl did not answer on {base}", file=sys.stderr)
            return 1
        tags = _get(base, "/app/api/tags")
        found = False
        for run in runs:
            scalars = sorted(k[len(run) + 1:].replace("%", "/") for k, kind in tags.items()
                             if kind == "scalar" and k.startswith(run + "/"))
            print(f"run {run}: {len(scalars)} scalar tags: {', '.join(scalars)}")
            if opts.tag in scalars:
                query = urllib.parse.urlencode({"run": run, "tag": opts.tag})
                points = _get(base, f"/app/api/scalar/list?{query}")
                _, step, value = points[-1]
                print(f"  {opts.tag}: {len(points)} points, last step {step} value {value}")
                found = True
        return 0 if found else 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not opts.logdir:
            shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
