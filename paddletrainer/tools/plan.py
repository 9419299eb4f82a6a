"""Which parallel layout to train a model with: every layout that fits, with its predicted peak memory per rank
and step time, fastest first (``paddletrainer.planning.plan``; docs/layouts.md, "Asking the planner").

    paddletrainer-plan path/to/config.json --devices 8 --profile A100-80G --global-batch 512 --seq-length 4096
    paddletrainer-plan --hidden-size 4096 --num-layers 32 --num-heads 32 --intermediate-size 11008 \\
        --vocab-size 32000 --devices 16 --device-memory 40 --global-batch 256 --seq-length 2048
    python -m paddletrainer.tools.plan ...

Bad input ends with one ``error: ...`` line naming the option and exit status 2; no layout fitting the memory
prints the closest ones and exits 1.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import List, Optional

from ..planning import PROFILES, Config, config_from_paddlenlp, get_profile, plan
from ..planning.memory_model import OPTIMIZER_STATES
from ..planning.planner import MAX_SIZE

MAX_DEVICES = 1 << 16  # the search prices every layout: ~240k of them, some 15 s, at 16k devices

SIZE_OPTIONS = {"hidden_size": "hidden", "num_layers": "layers", "num_heads": "heads", "vocab_size": "vocab",
                "intermediate_size": "intermediate"}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paddletrainer-plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", help="a PaddleNLP config.json (or give the sizes below)")
    for opt in SIZE_OPTIONS:
        ap.add_argument(f"--{opt.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--num-kv-heads", type=int, default=0, help="key/value heads (GQA; default: --num-heads)")
    ap.add_argument("--tie-embeddings", action="store_true", help="tied input/output embeddings")
    ap.add_argument("--devices", type=int, required=True, help="how many devices (ranks)")
    ap.add_argument("--profile", default="A100-80G", help=f"device profile: {', '.join(PROFILES)}")
    ap.add_argument("--device-memory", type=float, default=None, help="GiB per device (default: the profile's)")
    ap.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    ap.add_argument("--seq-length", type=int, default=None, help="tokens per sequence (default: the config's)")
    ap.add_argument("--optimizer", default="adamw", help="one of: " + ", ".join(OPTIMIZER_STATES))
    ap.add_argument("--max-micro-batch", type=int, default=8)
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the profile's peak TFLOPs")
    ap.add_argument("--efficiency", type=float, default=None, help="override the profile's matmul efficiency")
    ap.add_argument("--devices-per-node", type=int, default=None, help="override the profile's devices per node")
    ap.add_argument("--top", type=int, default=10, help="rows to print (default 10)")
    return ap


def _check_numbers(ap: argparse.ArgumentParser, a) -> None:
    """Every number in range before any search: the search's cost grows with the devices and the divisors."""
    for opt, hi in (("devices", MAX_DEVICES), ("global_batch", MAX_SIZE), ("max_micro_batch", MAX_SIZE),
                    ("top", MAX_SIZE), ("seq_length", MAX_SIZE), ("num_kv_heads", MAX_SIZE),
                    ("devices_per_node", MAX_DEVICES),
                    *((opt, MAX_SIZE) for opt in SIZE_OPTIONS)):
        value = getattr(a, opt)
        low = 0 if opt == "num_kv_heads" else 1
        if value is not None and not low <= value <= hi:
            ap.error(f"--{opt.replace('_', '-')} {value} is invalid: must be an integer in [{low}, {hi}]")
    for opt in ("device_memory", "peak_tflops", "efficiency"):
        value = getattr(a, opt)
        if value is not None and not (math.isfinite(value) and value > 0):
            ap.error(f"--{opt.replace('_', '-')} {value} is invalid: must be a finite positive number")
    if a.efficiency is not None and a.efficiency > 1:
        ap.error(f"--efficiency {a.efficiency} is invalid: must be in (0, 1] (a fraction of the peak)")


def _model(ap: argparse.ArgumentParser, a) -> Config:
    sizes = {opt: getattr(a, opt) for opt in SIZE_OPTIONS}
    if a.config is None:
        missing = [f"--{k.replace('_', '-')}" for k, v in sizes.items() if v is None]
        if missing:
            ap.error(f"give a config.json or every size: missing {', '.join(missing)}")
        if a.seq_length is None:
            ap.error("--seq-length is required with sizes")
        bad = [f"--{k.replace('_', '-')}" for k, v in sizes.items() if v < 1]
        if bad or a.num_heads and a.hidden_size % a.num_heads:
            ap.error(f"{', '.join(bad) or '--hidden-size'} must be positive (and --hidden-size a multiple of "
                     "--num-heads)")
        if a.num_kv_heads and (a.num_kv_heads < 1 or a.num_heads % a.num_kv_heads):  # 0: as many as --num-heads
            ap.error(f"--num-kv-heads {a.num_kv_heads} must be a positive divisor of --num-heads {a.num_heads}")
        return Config(seq=a.seq_length, kv_heads=a.num_kv_heads, tie=a.tie_embeddings,
                      **{field: sizes[opt] for opt, field in SIZE_OPTIONS.items()})
    given = [f"--{k.replace('_', '-')}" for k, v in sizes.items() if v is not None]
    given += [opt for opt, value in (("--num-kv-heads", a.num_kv_heads), ("--tie-embeddings", a.tie_embeddings))
              if value]  # the config.json says these too
    if given:
        ap.error(f"give a config.json or the sizes, not both: {a.config} and {', '.join(given)}")
    try:
        return config_from_paddlenlp(a.config, a.seq_length)
    except FileNotFoundError:
        ap.error(f"config: no such file {a.config}")
    except OSError as e:
        ap.error(f"config: {a.config}: {e.strerror or e}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        ap.error(f"config: {a.config} is not JSON ({e})")
    except ValueError as e:
        ap.error(f"config: {a.config}: {e}")


def _row(i: int, cand) -> list:
    lay, gib = cand.layout, 2**30
    comm = sum(v for k, v in cand.time.items() if k.startswith("comm_"))
    return [str(i), cand.name(), str(lay.micro_batch), str(lay.grad_accum), f"{cand.peak / gib:.1f}",
            f"{cand.memory['activations'] / gib:.1f}", f"{cand.step_time:.3f}", f"{cand.time['bubble']:.3f}",
            f"{comm:.3f}", f"{cand.tokens_per_s:,.0f}"]


def _print(rows: List[list], headers: List[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    for r in [headers, ["-" * w for w in widths], *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def main(argv: Optional[List[str]] = None) -> int:
    """Parse, plan, print the table; returns the exit status (0: a layout fits, 1: none does)."""
    ap = _parser()
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    _check_numbers(ap, a)
    c = _model(ap, a)
    if a.optimizer not in OPTIMIZER_STATES:
        ap.error(f"--optimizer: unknown optimizer {a.optimizer!r}; valid: {', '.join(OPTIMIZER_STATES)}")
    if a.profile not in PROFILES:
        ap.error(f"--profile: unknown profile {a.profile!r}; valid: {', '.join(PROFILES)}")
    prof = get_profile(a.profile, peak_tflops=a.peak_tflops, efficiency=a.efficiency,
                       devices_per_node=a.devices_per_node)
    try:
        cands = plan(c, a.devices, a.global_batch, prof, None if a.device_memory is None else a.device_memory * 2**30,
                     optimizer=a.optimizer, max_micro_batch=a.max_micro_batch, include_unfit=True)
    except ValueError as e:
        ap.error(str(e))
    if not cands:
        ap.error(f"--global-batch {a.global_batch}: no layout of {a.devices} devices divides it (it must be a "
                 "multiple of the data-parallel ranks dp x sharding of some layout)")
    fitting = [x for x in cands if x.fits]
    limit = prof.memory_bytes if a.device_memory is None else a.device_memory * 2**30
    print(f"{c.layers} layers, hidden {c.hidden}, seq {c.seq}, global batch {a.global_batch}; {a.devices} x "
          f"{prof.name} ({prof.dtype}, {limit / 2**30:.0f} GiB): {len(fitting)} of {len(cands)} layouts fit")
    headers = ["#", "layout", "micro", "accum", "peak GiB", "act GiB", "step s", "bubble s", "comm s", "tokens/s"]
    shown = fitting[:a.top] if fitting else sorted(cands, key=lambda x: x.peak)[:a.top]
    if not fitting:
        print("no layout fits; the smallest predicted peaks:")
    _print([_row(i + 1, x) for i, x in enumerate(shown)], headers)
    return 0 if fitting else 1


if __name__ == "__main__":
    sys.exit(main())
