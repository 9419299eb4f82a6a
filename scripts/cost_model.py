"""Per-rank memory and per-step communication of a Llama-style model under a dp × sharding × tp × pp × sep/cp
layout.

From formulas (``paddletrainer/planning/cost_model.py``, with the arithmetic spelled out; the layout planner
``paddletrainer-plan`` prices layouts with the same ones), for any config; then ``--measure`` checks them on
real CPU launches of ``paddletrainer.Trainer`` (tiny Llama, 2 processes per layout): a counting shim wraps
every method of Paddle's ``ProcessGroup`` (the object every Python collective ends in:
``paddle.distributed.all_reduce`` → ``group.process_group.all_reduce``; the CPU backend's pipeline p2p calls
``group.process_group.send/recv`` directly), and ``/proc/self/io`` ``wchar`` gives the bytes each process
actually wrote to its sockets (it also sees the C++ DataParallel reducer, which no Python shim can).

Two byte counts, per rank and optimizer step:

* **payload** — the size of the tensors handed to the collectives: an all-reduce of S bytes counts S, an
  all-gather counts its output, a send counts what it sends. The model predicts it exactly for a given
  implementation (Paddle's), so measured/model ≈ 1 says the formula describes what the code does.
* **wire** — bytes a rank sends, averaged over ranks. The *minimum* any implementation needs: ring
  all-reduce 2(N-1)/N·S, reduce-scatter or all-gather (N-1)/N·S, p2p S. Measured/min says how close the
  implementation is to optimal.

The measured wire is then explained call by call (`cost_measure.wire_factor`): the counted payload of each
collective times what gloo's algorithm sends for it predicts the measured ``wchar``, and the same calls
priced with NCCL's algorithms give the wire the same code would put on a GPU cluster — so a ratio above
the minimum splits into what the code sends and what gloo adds. On CPU the reduce-scatters (sequence
parallel, stage1 V2, stage 3) run through the CPU backend's exact fill over an all-reduce; they are counted
as reduce-scatters at their input (the fill's inner all-reduce is not counted again).
``--measure-hidden H`` measures a wider model (hidden H, intermediate 2H) than the tiny one, so that
per-tensor effects (Paddle's 4096-byte alignment of each parameter in the CPU sharding buffers) vanish.

    python scripts/cost_model.py --hidden 4096 --layers 32 --heads 32 --vocab 32000 --seq 4096 \\
        --intermediate 11008 --global-batch 512 --dp 2 --sharding 8 --stage 1 --tp 4 --pp 4
    python scripts/cost_model.py --seq 32768 --global-batch 8 --sep 4   # or --cp 4: the long-context axes
    python scripts/cost_model.py --tiny --measure --markdown
    python scripts/cost_model.py --tiny --measure --measure-hidden 512 --layouts stage1x2,stage2x2,stage3x2
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import fmt_bytes, machine_line, markdown_table, print_table, update_markdown_section  # noqa: E402
from cost_measure import LAYOUTS, MEASURE, PH, TINY_LLAMA, XH, run_measure, run_probe  # noqa: E402

# the formulas live in the library (one place); re-exported for the tests and scripts that import them from here
from paddletrainer.planning.cost_model import (  # noqa: E402,F401
    Config, Layout, communication, long_context_communication, memory, moe_all_to_all, param_counts, pipeline_bubble)


# ------------------------------------------------------------------------------------ printing
def print_model(c: Config, lay: Layout, dtype: str) -> tuple:
    pc = param_counts(c, lay)
    mem = memory(c, lay, dtype)
    comm = communication(c, lay, dtype)
    print(f"config: {dataclasses.asdict(c)}")
    print(f"layout: dp={lay.dp} sharding={lay.sharding} (stage {lay.stage}) tp={lay.tp} pp={lay.pp} vpp={lay.vpp} "
          f"sep={lay.sep} cp={lay.cp}; "
          f"pipeline bubble (p-1)/(v·m+p-1) = {100 * pipeline_bubble(lay):.1f}%; micro batch "
          f"{lay.micro_batch}, global batch {lay.global_batch}, accumulation {lay.grad_accum}; {dtype}")
    print(f"parameters: {pc['total']:,} total, {pc['rank']:,} on the busiest rank before sharding")
    mrows = [[k, fmt_bytes(v)] for k, v in mem.items()]
    if lay.sep * lay.cp > 1:  # what the long-context axis saves: the same layout with every sequence whole
        whole = memory(c, dataclasses.replace(lay, sep=1, cp=1), dtype)["activations"]
        axis = f"sep={lay.sep}" if lay.sep > 1 else f"cp={lay.cp}"
        mrows += [["activations with whole sequences (sep=cp=1)", fmt_bytes(whole)],
                  [f"activations saved per rank by {axis}", fmt_bytes(whole - mem["activations"])]]
    print_table("Per-rank memory (busiest rank)", ["what", "bytes"], mrows)
    crows = [[axis, fmt_bytes(v["payload"]), fmt_bytes(v["min_wire"]), v["what"]] for axis, v in comm.items()]
    print_table("Per-rank communication per optimizer step", ["axis", "payload", "min wire", "what"], crows)
    return mrows, crows


# ------------------------------------------------------------------------------------ the measured model
def tiny_config(hidden: int | None = None) -> Config:
    """The tiny Llama (hidden 64); ``hidden``: the same model widened (intermediate 2·hidden, as the tiny one)."""
    d = json.loads(TINY_LLAMA.read_text())
    h = hidden or d["hidden_size"]
    return Config(hidden=h, layers=d["num_hidden_layers"], heads=d["num_attention_heads"],
                  vocab=d["vocab_size"], seq=MEASURE["seq"], intermediate=2 * h if hidden else d["intermediate_size"],
                  kv_heads=d.get("num_key_value_heads", 0), tie=bool(d.get("tie_word_embeddings", False)))


def single_optim_bytes(c: Config, fused_qkv: bool = False, fused_ffn: bool = False) -> int:
    # AdamW over every parameter: moment1 + moment2 (fp32) plus two fp32 scalars (beta1^t, beta2^t) per param
    per_layer = 9 - (2 if fused_qkv else 0) - (1 if fused_ffn else 0)  # q,k,v,o,gate,up,down,2 norms; fused fewer
    n_tensors = 2 + c.layers * per_layer + 1 + (0 if c.tie else 1)  # emb, per layer, final norm, head
    return param_counts(c, Layout())["total"] * 8 + n_tensors * 2 * 4


def measured_layout_model(c: Config, kw: dict) -> tuple:
    """What ``--measure`` sets its measurements against, for one layout (``Layout`` keyword arguments) of ``c``:
    the communication per axis, and the single-process optimizer-state and parameter bytes (the 1/N references
    of the sharded-state table)."""
    optim = single_optim_bytes(c, kw.get("fused_qkv", False), kw.get("fused_ffn", False))
    return communication(c, Layout(**kw)), optim, param_counts(c, Layout())["total"] * 4


# ------------------------------------------------------------------------------------ main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tiny Llama config (and, with --measure, few layouts)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--tie", action="store_true", help="tied input/output embeddings")
    p.add_argument("--global-batch", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--sharding", type=int, default=1)
    p.add_argument("--stage", type=int, default=1, choices=(1, 2, 3))
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=1, help="virtual_pp_degree (interleaved pipeline chunks per stage)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--fused-qkv", action="store_true", help="fused q/k/v projection (fuse_attention_qkv)")
    p.add_argument("--fused-ffn", action="store_true", help="fused gate/up projection (fuse_attention_ffn)")
    p.add_argument("--sequence-parallel", action="store_true", help="sequence parallel inside tp (activations / tp)")
    p.add_argument("--sep", type=int, default=1, help="sep_parallel_degree (Ulysses all-to-all)")
    p.add_argument("--cp", type=int, default=1, help="context_parallel_degree (ring attention)")
    p.add_argument("--ep", type=int, default=1, help="expert_parallel_degree: prints the all-to-all of one MoE layer")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (with --ep)")
    p.add_argument("--measure", action="store_true", help="measure the tiny Llama on CPU launches (2 procs each)")
    p.add_argument("--measure-hidden", type=int, default=None,
                   help="measure the tiny Llama widened to this hidden size (intermediate 2x), e.g. 512: per-tensor "
                        "padding and whole-tensor partitions become negligible, as on a real model")
    p.add_argument("--layouts", default=None, help=f"comma list of {','.join(LAYOUTS)} (default all; tiny: dp2,stage1x2)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--section", default="Cost model (cost_model.py)",
                   help="the docs/benchmarks.md section --markdown replaces (e.g. one per group of layouts)")
    p.add_argument("--probe", action="store_true",
                   help="measure what gloo sends per payload byte for each collective on 2 ranks (wire_factor)")
    a = p.parse_args(argv)
    if a.probe:
        print(machine_line())
        prows = run_probe()
        print_table("gloo on 2 ranks: bytes each rank writes per payload byte (wchar)", PH, prows)
        if a.markdown:
            update_markdown_section(a.section, "\n".join([
                f"Machine: {machine_line()}.", f"`python scripts/cost_model.py {' '.join(argv or sys.argv[1:])}`", "",
                "Bytes each of 2 ranks writes (`/proc/self/io` wchar) per byte of payload, 3 calls per row, against "
                "`wire_factor` (the pricing of the measured calls in the sections above and below):", "",
                markdown_table(PH, prows)]))
        return None

    if a.tiny:
        c = tiny_config(a.measure_hidden)
        lay = Layout(dp=2, sharding=2, stage=1, tp=2, pp=2, micro_batch=2, global_batch=16, fused_qkv=a.fused_qkv,
                     fused_ffn=a.fused_ffn, sequence_parallel=a.sequence_parallel)
    else:
        c = Config(a.hidden, a.layers, a.heads, a.vocab, a.seq, a.intermediate, a.kv_heads, a.tie)
        gb = a.global_batch or a.micro_batch * a.dp * a.sharding * max(a.pp, 1) * 2
        lay = Layout(dp=a.dp, sharding=a.sharding, stage=a.stage if a.sharding > 1 else 0, tp=a.tp, pp=a.pp,
                     vpp=a.vpp, micro_batch=a.micro_batch, global_batch=gb, fused_qkv=a.fused_qkv, fused_ffn=a.fused_ffn,
                     sequence_parallel=a.sequence_parallel, sep=a.sep, cp=a.cp)
    print(machine_line())
    mrows, crows = print_model(c, lay, a.dtype)
    if a.ep > 1:
        moe = moe_all_to_all(lay.micro_batch * c.seq // (lay.sep * lay.cp), c.hidden, a.top_k, a.ep,
                             2 if a.dtype == "bf16" else 4)
        crows.append([f"ep{a.ep} (per MoE layer)", fmt_bytes(moe["payload"]), fmt_bytes(moe["min_wire"]), moe["what"]])
        print(f"\nexpert parallel: {crows[-1][0]}: payload {crows[-1][1]}, min wire {crows[-1][2]} ({moe['what']})")

    rows = srows = trows = xrows = []
    measured = "tiny Llama" + (f" widened to hidden {a.measure_hidden}" if a.measure_hidden else "")
    if a.measure:
        names = (a.layouts or ("dp2,stage1x2" if a.tiny else ",".join(LAYOUTS))).split(",")
        t0 = time.time()
        rows, srows, trows, xrows = run_measure(
            names, a.measure_hidden, functools.partial(measured_layout_model, tiny_config(a.measure_hidden)))
        print(f"\nmeasured: {measured} {dataclasses.asdict(tiny_config(a.measure_hidden))}, micro batch {MEASURE['micro_batch']}, "
              f"accumulation {MEASURE['grad_accum']}, {MEASURE['steps']} steps after {MEASURE['warmup_steps']} "
              f"warmup ({time.time() - t0:.0f} s)")
        mh = ["layout", "model payload", "measured payload", "ratio", "model min wire", "measured wire (wchar)",
              "ratio", "largest APIs (payload@group size)"]
        print_table("Communication per rank per step: model vs measured", mh, rows)
        print_table("Measured wire explained: the counted calls priced with gloo's and NCCL's algorithms", XH, xrows)
        if srows:
            print_table("Sharded state per rank (ratio to 1/N of the single-process total)",
                        ["layout", "rank", "optimizer state", "vs 1/N", "params held", "vs 1/N"], srows)
        print_table("Targets", ["layout", "target", "value", "status"], trows)

    if a.markdown:
        body = [f"Machine: {machine_line()}.",
                f"`python scripts/cost_model.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
                f"Model for {dataclasses.asdict(c)}, dp={lay.dp} sharding={lay.sharding} (stage {lay.stage}) "
                f"tp={lay.tp} pp={lay.pp} sep={lay.sep} cp={lay.cp}, global batch {lay.global_batch}, {a.dtype}:", "",
                markdown_table(["what", "bytes"], mrows), "",
                markdown_table(["axis", "payload", "min wire", "what"], crows)]
        if rows:
            body += ["", f"Measured on CPU launches ({measured}, micro batch {MEASURE['micro_batch']}, accumulation "
                     f"{MEASURE['grad_accum']}, per rank per step, averaged over ranks):", "",
                     markdown_table(["layout", "model payload", "measured payload", "ratio", "model min wire",
                                     "measured wire (wchar)", "ratio", "largest APIs"], rows), "",
                     "The measured wire explained: each counted call's payload × what gloo's algorithm sends for it "
                     "(`wire_factor`; the rest is message headers and rendezvous traffic), and the same calls priced "
                     "with NCCL's algorithms:", "", markdown_table(XH, xrows)]
        if srows:
            body += ["", markdown_table(["layout", "rank", "optimizer state", "vs 1/N", "params held", "vs 1/N"], srows)]
        if trows:
            body += ["", "Targets:", "", markdown_table(["layout", "target", "value", "status"], trows)]
        update_markdown_section(a.section, "\n".join(body))


if __name__ == "__main__":
    main()
