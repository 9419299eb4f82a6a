"""GPU smoke test: every layout × {fp32, bf16 O2, fp16} on a tiny Llama, against a one-device reference.

For each layout and precision it launches the public Trainer (``paddle.distributed.launch``) with an inf
injected into the backward of the last rank at step 3, an async checkpoint at step 2, and then resumes that
checkpoint under the next layout. It prints one row per run and exits 1 if any row fails:

    loss Δ      max relative difference of the per-step losses from the one-device run (same injection)
    gnorm Δ     the same for the gradient norms (the overflowed step left out)
    replicas    every parameter that is not split is bitwise equal on all ranks holding it
    skip/scale  every rank skipped step 3 only; fp16: the loss scale went 1024 → 512 on every rank
    autocast    auto_cast was active inside the model's forward in training and in evaluation
    ckpt        the async checkpoint resumed under the next layout continues the reference's losses
    tokens/s, peak MB   rank 0's last logged throughput and peak memory

Usage (2-8 GPUs; on a CPU-only Paddle it runs the same wiring in ``--amp_on_cpu fp32_dry_run`` on 2 processes;
needs PaddleNLP's Llama: ``pip install "paddletrainer[paddlenlp]"``):

    paddletrainer-gpu-smoke                       # all layouts that fit the visible devices
    paddletrainer-gpu-smoke --layouts dp2 pp2 --precisions fp16 --work_dir /tmp/smoke
    paddletrainer-gpu-smoke --lock /tmp/paddletrainer-mp.lock   # CPU, on a machine shared with other runs

(``python -m paddletrainer.tools.gpu_smoke`` and, in a checkout, ``python scripts/gpu_smoke.py`` are the same tool.)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from ..argparser import PdArgumentParser
from ..trainer_callback import TrainerCallback
from ..trainer import Trainer
from ..training_args import TrainingArguments

# the directory holding this paddletrainer package: the workers import the same one (a checkout or an install)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_STUB = "import sys\nfrom paddletrainer.tools.gpu_smoke import run_worker\nrun_worker(sys.argv[1:])\n"
INJECT_STEP, SAVE_STEP, MAX_STEPS = 3, 2, 4
VOCAB, SEQ = 96, 16

# name → (processes, TrainingArguments options); global batch 8 = per-device batch × 2 micro-batches × data ranks
LAYOUTS = {
    "dp2": (2, dict(per_device_train_batch_size=2)),
    "tp2": (2, dict(tensor_parallel_degree=2)),
    "pp2": (2, dict(pipeline_parallel_degree=2)),
    "sharding1": (2, dict(per_device_train_batch_size=2, sharding="stage1", sharding_parallel_degree=2)),
    "sharding2": (2, dict(per_device_train_batch_size=2, sharding="stage2", sharding_parallel_degree=2)),
    "sharding3": (2, dict(per_device_train_batch_size=2, sharding="stage3", sharding_parallel_degree=2,
                          sharding_stage3_segment_size=1000)),
    "tp2pp2": (4, dict(tensor_parallel_degree=2, pipeline_parallel_degree=2)),
    "dp2tp2pp2": (8, dict(per_device_train_batch_size=2, tensor_parallel_degree=2, pipeline_parallel_degree=2)),
}
PRECISIONS = {
    "fp32": dict(),
    "bf16": dict(bf16=True, fp16_opt_level="O2"),
    "fp16": dict(fp16=True, fp16_opt_level="O1", scale_loss=1024),
}
# Relative tolerance against the one-device run: on a GPU reduced precision and a different reduction order
# move the losses a little; the CPU dry run computes in fp32 and must agree closely.
GPU_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}
CPU_RTOL = 1e-5


# =============================================================================== worker side (one rank)
@dataclass
class SmokeArguments:
    weights: str = field(default="", metadata={"help": "tiny Llama directory"})
    result_dir: str = field(default="", metadata={"help": "where rank<r>.json goes"})
    inject_step: int = field(default=INJECT_STEP, metadata={"help": "step whose backward gets an inf"})
    inject_rank: int = field(default=0, metadata={"help": "the only rank that injects"})


def _inf_in_backward():
    import paddle

    class InfInBackward(paddle.autograd.PyLayer):
        """Identity forward; the backward multiplies the incoming gradient by inf (an fp16 overflow)."""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    return InfInBackward


def instrument(model, trainer_callback_cls, inject_step: int, inject_rank: int):
    """Hooks on the first ``LlamaMLP`` of this rank: the inf injection and an auto_cast spy.

    Returns ``(callback, seen)``: add the callback to the Trainer; ``seen`` collects the auto_cast settings
    active inside the forward, by "train"/"eval".
    """
    import paddle
    from paddle.amp.auto_cast import amp_state

    inf_layer = _inf_in_backward()
    seen = {"train": set(), "eval": set()}

    class Injector(trainer_callback_cls):
        armed = False

        def on_step_begin(self, args, state, control, **kwargs):
            self.armed = paddle.distributed.get_rank() == inject_rank and state.global_step + 1 == inject_step

        def on_step_end(self, args, state, control, **kwargs):
            self.armed = False

    injector = Injector()

    def spy(layer, inputs):
        state = amp_state()
        seen["train" if layer.training else "eval"].add("off" if state is None else f"{state['dtype']}/{state['level']}")

    def inject(layer, inputs, output):
        return inf_layer.apply(output) if injector.armed and layer.training else None

    mlp = next((m for m in model.sublayers() if type(m).__name__ == "LlamaMLP"), None)
    if mlp is None:
        raise RuntimeError("no LlamaMLP on this rank")
    mlp.register_forward_pre_hook(spy)
    mlp.register_forward_post_hook(inject)
    return injector, seen


def token_data(n, seed):
    import numpy as np

    tokens = np.random.RandomState(seed).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def replicated_digests(model) -> dict:
    """sha1 of every initialised parameter that is not split (tensor parallel), by structural name."""
    out = {}
    for name, param in model.named_parameters():
        if param._is_initialized() and not getattr(param, "is_distributed", False):
            out[name] = hashlib.sha1(param.astype("float32").numpy().tobytes()).hexdigest()
    return out


def run_worker(argv) -> None:
    import numpy as np
    import paddle

    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    smoke, args = PdArgumentParser((SmokeArguments, TrainingArguments)).parse_args_into_dataclasses(argv)
    config = LlamaConfig.from_pretrained(smoke.weights)
    config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.tensor_parallel_output = False
    cls = LlamaForCausalLMPipe if args.pipeline_parallel_degree > 1 else LlamaForCausalLM
    model = cls.from_pretrained(smoke.weights, config=config, dtype="float32")
    injector, seen = instrument(model, TrainerCallback, smoke.inject_step, smoke.inject_rank)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(48, 0), eval_dataset=token_data(8, 1),
                      callbacks=[injector])
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.evaluate()
    logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    params = list(trainer.model.parameters())
    finite = all(bool(np.isfinite(p.astype("float32").numpy()).all()) for p in params if p._is_initialized())
    result = {
        "steps": [h["global_step"] for h in logs], "losses": [h["loss"] for h in logs],
        "grad_norms": [h["grad_norm"] for h in logs], "loss_scales": [h.get("loss_scale") for h in logs],
        "skipped_steps": [h.get("skipped_steps", 0) for h in logs],
        "tokens_per_second": logs[-1].get("tokens_per_second") if logs else None,
        "peak_memory_MB": logs[-1].get("peak_memory_MB") if logs else None,
        "params_finite": finite, "replicated": replicated_digests(trainer.model),
        "autocast": {k: sorted(v) for k, v in seen.items()},
    }
    os.makedirs(smoke.result_dir, exist_ok=True)
    with open(os.path.join(smoke.result_dir, f"rank{paddle.distributed.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    if paddle.distributed.get_world_size() > 1:
        paddle.distributed.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo/NCCL teardown at exit is not ordered across ranks; every result is on disk


# =========================================================================== driver side (the table)
def on_gpu() -> bool:
    import paddle

    return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def device_count() -> int:
    import paddle

    return paddle.device.cuda.device_count() if on_gpu() else 2


def save_tiny_llama(path: str) -> None:
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(2024)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ, seq_length=SEQ,
                         rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                         fuse_attention_qkv=False, fuse_attention_ffn=False, tie_word_embeddings=False,
                         dtype="float32")
    LlamaForCausalLM(config).save_pretrained(path)


def trainer_options(work: str, precision: str, layout_options: dict, inject_rank: int, gpu: bool, **extra) -> list:
    options = dict(output_dir=os.path.join(work, "out"), result_dir=os.path.join(work, "res"),
                   per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.01,
                   max_grad_norm=0.8, max_steps=MAX_STEPS, logging_steps=1, save_steps=SAVE_STEP, seed=7,
                   lr_scheduler_type="linear", warmup_steps=1, per_device_eval_batch_size=4, report_to="none",
                   disable_tqdm=True, checkpoint_async_save=True, nan_inf_policy="skip", inject_rank=inject_rank)
    options.update(PRECISIONS[precision])
    if precision != "fp32" and not gpu:
        options["amp_on_cpu"] = "fp32_dry_run"
    options.update(layout_options)
    options.update(extra)
    argv = []
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    return argv


def run(nproc: int, argv: list, work: str, gpu: bool, timeout: int, lock: str = None) -> list:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
    # paddle.distributed.launch runs a script file: a stub that calls run_worker (running this module's own file
    # would put paddletrainer/ first on sys.path, where its `datasets` package shadows Hugging Face's)
    script = os.path.join(work, "gpu_smoke_worker.py")
    os.makedirs(work, exist_ok=True)
    with open(script, "w") as f:
        f.write(WORKER_STUB)
    if nproc == 1:
        cmd = [sys.executable, script, *argv]
        env = {k: v for k, v in env.items() if not k.startswith("PADDLE_")}
    else:
        where = ["--devices", ",".join(map(str, range(nproc)))] if gpu else ["--nproc_per_node", str(nproc)]
        cmd = [sys.executable, "-m", "paddle.distributed.launch", *where, "--log_dir", os.path.join(work, "logs"),
               script, *argv]
    if lock:  # one launch at a time on a shared machine
        cmd = ["flock", lock, *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    res = argv[argv.index("--result_dir") + 1]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd[:6])} ...\n{tail}")
    return [json.load(open(os.path.join(res, f"rank{r}.json"))) for r in range(nproc)]


def max_rel_diff(actual, expected, skip_step=None) -> float:
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        if skip_step is not None and i + 1 == skip_step:
            continue
        worst = max(worst, abs(a - e) / max(abs(e), 1e-12))
    return worst if len(actual) == len(expected) else float("inf")


def judge(precision, ranks, reference, resumed, rtol) -> dict:
    """One table row's checks from a layout's per-rank results, its resumed run and the one-device run."""
    want_skips = [0 if s < INJECT_STEP else 1 for s in range(1, MAX_STEPS + 1)]
    want_scales = [1024.0 if s < INJECT_STEP else 512.0 for s in range(1, MAX_STEPS + 1)] if precision == "fp16" \
        else [None] * MAX_STEPS
    want_autocast = {"fp32": "off", "bf16": "bfloat16/O2", "fp16": "float16/O1"}[precision]
    loss_diff = max(max_rel_diff(r["losses"], reference["losses"]) for r in ranks)
    norm_diff = max(max_rel_diff(r["grad_norms"], reference["grad_norms"], INJECT_STEP) for r in ranks)
    holders = {}
    for i, r in enumerate(ranks):
        for name, digest in r["replicated"].items():
            holders.setdefault(name, set()).add(digest)
    replicas = all(len(d) == 1 for d in holders.values())
    skip_scale = all(r["skipped_steps"] == want_skips and r["loss_scales"] == want_scales and r["params_finite"]
                     for r in ranks)
    autocast = all(r["autocast"] == {"train": [want_autocast], "eval": [want_autocast]} for r in ranks)
    ckpt_diff = max(max_rel_diff(r["losses"], reference["losses"][SAVE_STEP:]) for r in resumed)
    checks = dict(loss=loss_diff <= rtol, gnorm=norm_diff <= rtol, replicas=replicas, skip_scale=skip_scale,
                  autocast=autocast, ckpt=ckpt_diff <= rtol)
    return dict(loss_diff=loss_diff, norm_diff=norm_diff, ckpt_diff=ckpt_diff, checks=checks,
                tokens=ranks[0]["tokens_per_second"], peak=ranks[0]["peak_memory_MB"], ok=all(checks.values()))


def main(argv=None) -> int:
    """Run the table (``--worker ARGS``: one rank's run instead); returns the exit status (1 if a row failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        run_worker(argv[1:])  # exits the process
    parser = argparse.ArgumentParser(prog="paddletrainer-gpu-smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=None, choices=sorted(LAYOUTS),
                        help="layouts to run (default: every layout that fits the visible devices)")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    parser.add_argument("--work_dir", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    parser.add_argument("--lock", default=None, help="hold this flock file during each launch (shared machines)")
    a = parser.parse_args(argv)
    gpu = on_gpu()
    devices = device_count()
    layouts = a.layouts or [name for name, (n, _) in LAYOUTS.items() if n <= devices]
    too_big = [name for name in layouts if LAYOUTS[name][0] > devices]
    if too_big:
        parser.error(f"--layouts {' '.join(too_big)} need more than the {devices} devices available")
    work = a.work_dir or tempfile.mkdtemp(prefix="gpu_smoke_")
    weights = os.path.join(work, "tiny_llama")
    if not os.path.isdir(weights):
        save_tiny_llama(weights)
    rtol = {p: GPU_RTOL[p] if gpu else CPU_RTOL for p in PRECISIONS}
    print(f"gpu_smoke: {'GPU' if gpu else 'CPU dry run (fp32 math, AMP wiring live)'}, {devices} devices, work dir {work}")
    header = ("layout", "precision", "loss Δ", "gnorm Δ", "replicas", "skip/scale", "autocast", "ckpt", "tokens/s",
              "peak MB", "result")
    print(" | ".join(header))
    failures = 0
    for precision in a.precisions:
        ref_dir = os.path.join(work, f"reference_{precision}")
        reference = run(1, trainer_options(ref_dir, precision, {}, 0, gpu, weights=weights), ref_dir, gpu, a.timeout,
                        a.lock)[0]
        for i, name in enumerate(layouts):
            nproc, options = LAYOUTS[name]
            run_dir = os.path.join(work, f"{name}_{precision}")
            try:
                ranks = run(nproc, trainer_options(run_dir, precision, options, nproc - 1, gpu, weights=weights),
                            run_dir, gpu, a.timeout, a.lock)
                nxt = layouts[(i + 1) % len(layouts)]
                n2, options2 = LAYOUTS[nxt]
                resume_dir = os.path.join(work, f"{name}_{precision}_resumed_as_{nxt}")
                ckpt = os.path.join(run_dir, "out", f"checkpoint-{SAVE_STEP}")
                resumed = run(n2, trainer_options(resume_dir, precision, options2, n2 - 1, gpu, weights=weights,
                                                  resume_from_checkpoint=ckpt), resume_dir, gpu, a.timeout, a.lock)
                row = judge(precision, ranks, reference, [{"losses": r["losses"][SAVE_STEP:]} for r in resumed], rtol[precision])
            except Exception as exc:  # noqa: BLE001 - a failed launch is a FAIL row, the others still run
                print(f"{name} | {precision} | launch failed: {str(exc).splitlines()[0]}")
                print(str(exc)[-1500:], file=sys.stderr)
                failures += 1
                continue
            c = row["checks"]
            mark = lambda ok: "ok" if ok else "FAIL"  # noqa: E731
            print(" | ".join([name, precision, f"{row['loss_diff']:.1e}", f"{row['norm_diff']:.1e}", mark(c["replicas"]),
                              mark(c["skip_scale"]), mark(c["autocast"]), f"{mark(c['ckpt'])} ({row['ckpt_diff']:.0e})",
                              f"{row['tokens'] or 0:.0f}", f"{row['peak'] or 0:.0f}", "PASS" if row["ok"] else "FAIL"]))
            failures += 0 if row["ok"] else 1
    print(f"gpu_smoke: {'PASS' if failures == 0 else f'FAIL ({failures} failing rows)'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
