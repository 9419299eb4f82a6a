"""Per-stage idle time of a 4-stage pipeline (1F1B, or interleaved with ``--vpp``) against the ideal bubble.

One launch of 4 CPU processes (pp=4) trains a tiny Llama (``LlamaForCausalLMPipe``) through paddletrainer's
own path (``init_topology`` → ``parallelize`` → ``parallel.pipeline.train_batch`` → ``ParallelOptimizer``),
for several micro-batch counts m in the same processes (the pipeline's ``accumulate_steps`` is set per run).

Idle time of a stage = the wall time it spends inside the pipeline's blocking point-to-point calls (the CPU
backend's ``send``/``recv``, wrapped with a timer): waiting for the neighbour stage plus the copy itself.
Busy = the rest of ``train_batch``. Measured idle fraction = idle / ``train_batch`` time, median over steps
after warmup, compared with the bubble of equal stages: (p-1)/(m+p-1) for 1F1B, (p-1)/(v·m+p-1) for the
interleaved schedule with v chunks per stage (``--vpp v``: ``virtual_pp_degree``; the layers are rounded up to a
multiple of p·v, and micro-batch counts Paddle's interleaved schedules do not accept are skipped).

Caveats, printed with the table: 4 processes share this machine's cores (``OMP_NUM_THREADS=1`` each), so a
stage's compute slows down when its neighbours compute too and speeds up when they wait; the first stage
holds the embedding and the last the LM head and loss, so stages are not equal.

    python scripts/bench_pipeline.py --tiny
    python scripts/bench_pipeline.py --tiny --vpp 2
    python scripts/bench_pipeline.py --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import launch, machine_line, markdown_table, median, print_table, update_markdown_section  # noqa: E402

DEFAULT_PP = 4  # default pipeline degree (--pp)


def shapes(tiny: bool, pp: int = DEFAULT_PP, vpp: int = 1) -> dict:
    if tiny:
        sh = dict(hidden=64, layers=4, heads=4, inter=128, vocab=640, seq=32, micro_batch=2, ms=[4],
                  warmup=1, steps=2)
    else:
        sh = dict(hidden=128, layers=8, heads=4, inter=344, vocab=1000, seq=128, micro_batch=2, ms=[4, 8, 16],
                  warmup=1, steps=3)
    if vpp > 1:
        chunks = pp * vpp
        sh["layers"] = -(-sh["layers"] // chunks) * chunks
        # the schedule class is fixed at construction from the largest m: interleaved 1F1B needs m >= 2p
        sh["ms"] = [m for m in sh["ms"] if m >= 2 * pp] or [2 * pp]
    return sh


def bubble(p: int, m: int, v: int = 1) -> float:
    """Ideal idle fraction of equal stages: (p-1)/(v·m+p-1) (v = 1: 1F1B)."""
    return (p - 1) / (v * m + p - 1)


def worker(a) -> None:
    import logging

    import numpy as np
    import paddle
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

    from paddletrainer import TrainingArguments
    from paddletrainer.parallel import init_topology, parallelize, pipeline

    logging.disable(logging.WARNING)
    sh = shapes(a.tiny, a.pp, a.vpp)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), pipeline_parallel_degree=a.pp, virtual_pipeline_model_parallel_size=a.vpp,
                             # the largest m: PipelineParallel sizes its per-micro-batch hook slots at construction
                             gradient_accumulation_steps=max(sh["ms"]), per_device_train_batch_size=sh["micro_batch"],
                             report_to="none", disable_tqdm=True, seed=5)
    topo = init_topology(args.parallel_config)

    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLMPipe

    cfg = LlamaConfig(vocab_size=sh["vocab"], hidden_size=sh["hidden"], num_hidden_layers=sh["layers"],
                      num_attention_heads=sh["heads"], num_key_value_heads=sh["heads"], intermediate_size=sh["inter"],
                      max_position_embeddings=max(128, sh["seq"]), use_flash_attention=False,
                      tie_word_embeddings=False)
    cfg.virtual_pp_degree = a.vpp
    paddle.seed(5)
    model = LlamaForCausalLMPipe(cfg)
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    model, opt = parallelize(model, opt, topo, args.parallel_config)

    # time every blocking p2p call (the CPU backend's fills are module globals, looked up per call)
    idle = [0.0]

    def timed(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                idle[0] += time.perf_counter() - t0
        return run

    p2p._send_on_calc_stream = timed(p2p._send_on_calc_stream)
    p2p._recv_on_calc_stream = timed(p2p._recv_on_calc_stream)

    rng = np.random.RandomState(0)
    results = []
    for m in sh["ms"]:
        model.accumulate_steps = m
        totals, idles = [], []
        for step in range(sh["warmup"] + sh["steps"]):
            ids = rng.randint(3, sh["vocab"], size=(m, sh["micro_batch"], sh["seq"] + 1)).astype("int64")
            micro = [{"input_ids": paddle.to_tensor(x[:, :-1]), "labels": paddle.to_tensor(x[:, 1:])} for x in ids]
            paddle.distributed.barrier()
            idle[0] = 0.0
            t0 = time.perf_counter()
            pipeline.train_batch(model, micro)
            total = time.perf_counter() - t0
            if step >= sh["warmup"]:
                totals.append(total)
                idles.append(idle[0])
            opt.step()
            opt.clear_grad()
        results.append({"m": m, "stage": topo.pp_rank, "total": median(totals),
                        "idle": median(idles), "idle_frac": median(i / t for i, t in zip(idles, totals))})
    Path(a.result_dir, f"rank{paddle.distributed.get_rank()}.json").write_text(json.dumps(results))


HEADERS = ["m", "stage", "train_batch s", "idle s", "busy s", "idle fraction", "bubble (p-1)/(v·m+p-1)"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="m=4 only, tiny shapes (smoke test)")
    p.add_argument("--pp", type=int, default=DEFAULT_PP, help="pipeline degree = processes (default 4)")
    p.add_argument("--vpp", type=int, default=1, help="virtual_pp_degree: chunks per stage (default 1: 1F1B)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    print(machine_line())
    sh = shapes(a.tiny, a.pp, a.vpp)
    P, V = a.pp, a.vpp
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        launch(__file__, P, ["--worker", "--result-dir", tmp, "--pp", P, "--vpp", V] + (["--tiny"] if a.tiny else []),
               os.path.join(tmp, "logs"), timeout=600, env_extra={"OMP_NUM_THREADS": "1"})
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(P)]
    rows, summary = [], []
    for i, m in enumerate(sh["ms"]):
        ideal = bubble(P, m, V)
        fr = []
        for r in range(P):
            res = per_rank[r][i]
            rows.append([m, res["stage"], res["total"], res["idle"], res["total"] - res["idle"],
                         f"{100 * res['idle_frac']:.1f}%", f"{100 * ideal:.1f}%"])
            fr.append(res["idle_frac"])
        summary.append([m, f"{100 * sum(fr) / P:.1f}%", f"{100 * min(fr):.1f}%..{100 * max(fr):.1f}%", f"{100 * ideal:.1f}%"])
    print(f"pp={P}, vpp={V}, tiny Llama hidden {sh['hidden']}, {sh['layers']} layers, seq {sh['seq']}, micro batch "
          f"{sh['micro_batch']}; median of {sh['steps']} steps after {sh['warmup']} warmup ({time.time() - t0:.0f} s)")
    schedule = "1F1B" if V == 1 else f"interleaved, {V} chunks per stage"
    print_table(f"Pipeline idle time per stage ({schedule})", HEADERS, rows)
    print_table("Mean idle fraction vs the bubble", ["m", "mean idle", "range over stages", "bubble (p-1)/(v·m+p-1)"], summary)
    print(f"note: {P} processes share the machine's cores; stage 0 has the embedding, stage 3 the LM head + loss")
    if a.markdown:
        body = [f"Machine: {machine_line()}.",
                f"`python scripts/bench_pipeline.py {' '.join(argv if argv is not None else sys.argv[1:])}`: pp={P} vpp={V} "
                f"({P} CPU processes, OMP_NUM_THREADS=1), tiny Llama hidden {sh['hidden']}, {sh['layers']} layers, seq "
                f"{sh['seq']}, micro batch {sh['micro_batch']}; idle = time inside the blocking p2p send/recv.", "",
                markdown_table(HEADERS, rows), "", markdown_table(["m", "mean idle", "range over stages", "bubble (p-1)/(v·m+p-1)"], summary)]
        update_markdown_section("Pipeline bubble (bench_pipeline.py)", "\n".join(body))


if __name__ == "__main__":
    main()
