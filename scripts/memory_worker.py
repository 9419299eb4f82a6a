"""One rank of ``bench_memory.py``: train a Llama through the public Trainer and write what this rank holds.

Launched by ``bench_memory.py`` (``paddle.distributed.launch``, or a plain process for one rank):

    python scripts/memory_worker.py --layout dp2 --hidden 512 --layers 4 --heads 8 --intermediate 1408 \\
        --vocab 32000 --seq 64 --steps 3 --result-dir DIR
    python scripts/memory_worker.py --layout single --hidden 64 --layers 2 --heads 4 --intermediate 128 \
        --vocab 640 --seq 2048 --steps 3 --result-dir DIR --data-limit-mib 1000   # the long-context mode's budget

Measured per rank (``rank<r>.json``):

* ``baseline``: the process after imports, ``TrainingArguments`` and ``init_topology`` (before the model):
  libraries, the communication context — the fixed cost every rank pays whatever the model;
* tensor bytes, counted in the last step (after backward, before the optimizer step; the optimizer's state
  after the step), each *storage* once: every tensor is an address range, overlapping ranges (views, fused
  buffers) are merged. Kinds: ``params`` (parameters, stage 3's slices), ``grads`` (``.grad`` and the
  sharding wrappers' per-parameter gradient slices), ``optimizer`` (the accumulators), ``master`` (master
  weights), ``comm_buffers`` (every other tensor reachable from the model and optimizer wrappers: fused
  communication buffers; the model's own buffers, such as rotary caches, are left out);
* memory: the peak RSS of the whole run (``VmHWM``; on GPU Paddle's ``max_memory_allocated``), the peak
  before training (model construction and wrapping), the memory when the last step begins and its peak
  (the high-water mark reset at the step's start), and the memory right before the last optimizer step.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import peak_rss_bytes, peak_rss_reset  # noqa: E402

# name: (ranks, TrainingArguments/LlamaConfig options). The 2-rank layouts of the Trainer matrix, one process,
# and recompute / sequence parallel on and off; the 4-rank ones are run at the small size only.
LAYOUTS = {
    "single": (1, {}),
    "single_rc": (1, {"recompute": True}),
    "dp2": (2, {"dp": 2}),
    "stage1x2": (2, {"sharding": 2, "stage": 1}),
    "stage1v2x2": (2, {"sharding": 2, "stage": 1, "split_param": True}),
    "stage2x2": (2, {"sharding": 2, "stage": 2}),
    "stage3x2": (2, {"sharding": 2, "stage": 3}),
    "tp2": (2, {"tp": 2}),
    "tp2_rc": (2, {"tp": 2, "recompute": True}),
    "tp2_sp": (2, {"tp": 2, "sequence_parallel": True}),
    "pp2": (2, {"pp": 2}),
    "dp4": (4, {"dp": 4}),
    "tp2_pp2": (4, {"tp": 2, "pp": 2}),
    "stage3x4": (4, {"sharding": 4, "stage": 3}),
}
# The long-context mode (bench_memory.py --long-context): one sequence split over sep (Ulysses) or cp (ring) ranks.
LONG_CONTEXT_LAYOUTS = {
    "sep2": (2, {"sep": 2}),
    "sep4": (4, {"sep": 4}),
    "cp2": (2, {"cp": 2}),
    "cp4": (4, {"cp": 4}),
}
ALL_LAYOUTS = {**LAYOUTS, **LONG_CONTEXT_LAYOUTS}
STAGE3_SEGMENT = 4096  # every weight matrix sliced under stage 3 (the norms, 'hidden' elements, stay whole)


# ------------------------------------------------------------------------------------ memory counters
def _on_gpu() -> bool:
    from paddletrainer.device import on_cuda_device

    return on_cuda_device()


def mem_now() -> int:
    """Bytes in use now: host RSS on CPU, Paddle's allocated bytes on GPU."""
    if _on_gpu():
        import paddle

        return int(paddle.device.cuda.memory_allocated())
    from paddletrainer.metrics.process_memory import current_rss_bytes

    return current_rss_bytes()


def mem_peak() -> int:
    if _on_gpu():
        import paddle

        return int(paddle.device.cuda.max_memory_allocated())
    return peak_rss_bytes()


def mem_peak_reset() -> None:
    if _on_gpu():
        import paddle

        paddle.device.cuda.reset_max_memory_allocated()
    elif not peak_rss_reset():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs): this benchmark needs Linux")


# ------------------------------------------------------------------------------------ counting storage
def _ranges(tensors) -> list:
    """(start, end) address ranges of the initialized, non-empty tensors."""
    out = []
    for t in tensors:
        if t is None or not t._is_initialized() or int(t.numel()) == 0:
            continue
        start = int(t.data_ptr())
        out.append((start, start + int(t.numel()) * t.element_size()))
    return out


def _union(ranges) -> list:
    merged = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _minus(ranges, taken) -> int:
    """Bytes of the union of ``ranges`` not covered by the union of ``taken``."""
    total, taken = 0, _union(taken)
    for start, end in _union(ranges):
        covered = sum(max(0, min(end, b) - max(start, a)) for a, b in taken if a < end and b > start)
        total += end - start - covered
    return total


def _reachable_tensors(roots, max_depth: int = 8) -> list:
    """Every paddle Tensor reachable through attributes, dicts and sequences of Paddle's/our wrapper objects."""
    import paddle

    seen, found, stack = set(), [], [(r, 0) for r in roots]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > max_depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, paddle.Tensor):
            found.append(obj)
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            children = list(obj)
        elif type(obj).__module__.split(".")[0] in ("paddle", "paddletrainer", "paddlenlp") and hasattr(obj, "__dict__"):
            children = list(vars(obj).values())
        else:
            continue
        stack.extend((c, depth + 1) for c in children)
    return found


def count_model_side(model_wrapped, optimizer) -> dict:
    """Unique bytes of this rank's parameters, gradients and the other tensors the wrappers hold."""
    from paddletrainer.parallel.wrappers import unwrap_model

    params = list(model_wrapped.parameters())
    p_ranges = _ranges(params + [getattr(p, "fw_storage", None) for p in params])
    grad_like = []
    for p in params:
        grad_like += [p.grad, getattr(p, "main_grad", None), getattr(p, "bw_storage", None)]
    g_ranges = _ranges(grad_like)
    buffers = _ranges(list(unwrap_model(model_wrapped).buffers()))
    everything = _ranges(_reachable_tensors([model_wrapped, optimizer]))
    return {"params": _minus(p_ranges, []), "grads": _minus(g_ranges, p_ranges),
            "_taken": p_ranges + g_ranges + buffers, "_everything": everything}


def count_optimizer_side(optimizer, taken: list, everything: list) -> dict:
    from paddletrainer.parallel.wrappers import unwrap_optimizer

    inner = unwrap_optimizer(optimizer)
    accs = [t for kind in (getattr(inner, "_accumulators", None) or {}).values() for t in kind.values()]
    masters = list((getattr(inner, "_master_weights", None) or {}).values())
    a_ranges, m_ranges = _ranges(accs), _ranges(masters)
    opt = _minus(a_ranges, taken)
    master = _minus(m_ranges, taken + a_ranges)
    comm = _minus(everything + _ranges(_reachable_tensors([optimizer])), taken + a_ranges + m_ranges)
    return {"optimizer": opt, "master": master, "comm_buffers": comm}


# ------------------------------------------------------------------------------------ the run
def build_args(a, lay: dict, output_dir: str):
    from paddletrainer import TrainingArguments

    kw = dict(output_dir=output_dir, max_steps=a.steps, per_device_train_batch_size=1,
              gradient_accumulation_steps=lay.get("pp", 1),  # the pipeline needs a micro-batch per stage
              logging_steps=10_000, save_strategy="no", disable_tqdm=True, report_to="none", max_grad_norm=1.0,
              learning_rate=1e-5, seed=3, tensor_parallel_degree=lay.get("tp", 1),
              pipeline_parallel_degree=lay.get("pp", 1), remove_unused_columns=False,
              recompute=bool(lay.get("recompute")), sequence_parallel=bool(lay.get("sequence_parallel")))
    kw.update(long_context_options(lay))
    if lay.get("sharding", 1) > 1:
        kw.update(sharding=f"stage{lay['stage']}", sharding_parallel_degree=lay["sharding"],
                  sharding_stage3_segment_size=STAGE3_SEGMENT)
        if lay.get("split_param"):
            kw.update(sharding_parallel_config="split_param")
    return TrainingArguments(**kw)


def long_context_options(lay: dict) -> dict:
    """The sep / cp degrees of a long-context layout as TrainingArguments options (none for the others)."""
    return {option: lay[key] for key, option in (("sep", "sep_parallel_degree"), ("cp", "context_parallel_degree"))
            if lay.get(key, 1) > 1}


def configure_long_context(cfg, lay: dict) -> None:
    """Llama's sep attention (ReshardLayer) or its ring-attention path, which it runs only on the flash-attention
    path (on the CPU build the cp axis puts our ring attention there); plain math attention otherwise."""
    cfg.sep_parallel_degree = lay.get("sep", 1)
    cfg.context_parallel_degree = lay.get("cp", 1)
    cfg.use_flash_attention = lay.get("cp", 1) > 1
    cfg.use_fused_rope = False


def build_model(a, args, lay: dict):
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                      max_position_embeddings=max(128, a.seq), tie_word_embeddings=False)
    cfg.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    cfg.tensor_parallel_rank = args.tensor_parallel_rank
    cfg.tensor_parallel_output = False
    cfg.sequence_parallel = bool(lay.get("sequence_parallel"))
    cfg.seq_length = a.seq
    configure_long_context(cfg, lay)
    paddle.seed(3)
    return (LlamaForCausalLMPipe if args.pipeline_parallel_degree > 1 else LlamaForCausalLM)(cfg)


def run(a) -> dict:
    import numpy as np
    import paddle
    import paddlenlp.transformers  # noqa: F401  (before the baseline: a library every rank loads)

    from paddletrainer import Trainer, TrainerCallback
    from paddletrainer.parallel import init_topology

    logging.disable(logging.WARNING)
    nproc, lay = ALL_LAYOUTS[a.layout]
    args = build_args(a, lay, tempfile.mkdtemp())
    init_topology(args.parallel_config)
    out = {"rank": paddle.distributed.get_rank(), "device": "gpu" if _on_gpu() else "cpu", "baseline": mem_now()}
    model = build_model(a, args, lay)
    out["params_unsharded"] = sum(int(p.numel()) for p in model.parameters())
    out["after_model"] = mem_now()
    ids = np.random.RandomState(0).randint(3, a.vocab, size=(8 * a.steps, a.seq + 1)).astype("int64")
    data = [{"input_ids": t[:-1], "labels": t[1:]} for t in ids]
    marks = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            out["peak_before_training"] = mem_peak()

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == a.steps - 1:  # the last step: reset the high-water mark
                out["peak_before_last_step"] = mem_peak()
                out["last_step_start"] = mem_now()
                mem_peak_reset()

        def on_optimizer_begin(self, args, state, control, **kwargs):
            if state.global_step == a.steps - 1:
                out["before_optimizer_step"] = mem_now()
                marks.update(count_model_side(trainer.model_wrapped, trainer.optimizer))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == a.steps:
                out["last_step_peak"] = mem_peak()
                out.update(count_optimizer_side(trainer.optimizer, marks.pop("_taken"), marks.pop("_everything")))
                out.update(marks)

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Probe()])
    trainer.train()
    out["peak"] = max(out["peak_before_last_step"], out["last_step_peak"])
    return out


def run_within_data_limit(a) -> dict:
    """``run`` under ``RLIMIT_DATA`` (set before Paddle is imported: the limit covers the whole process).

    RLIMIT_DATA, not RLIMIT_AS: it bounds the private writable mappings, where Paddle's CPU allocator gets its
    memory (``posix_memalign``; beyond the limit it raises ``MemoryError: (ResourceExhausted) Fail to alloc``),
    while RLIMIT_AS would also count the address space Paddle and its threads reserve but never touch. An
    allocation refused there ends the rank with its result file saying so (``out_of_memory``): the bench
    reports it as a row, not as a crash."""
    limit = a.data_limit_mib * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        result = run(a)
    except MemoryError as e:
        rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        Path(a.result_dir, f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "out_of_memory": str(e).strip().splitlines()[0][:300], "peak": peak_rss_bytes()}))
        sys.stderr.write(f"rank {rank}: out of memory under RLIMIT_DATA={a.data_limit_mib} MiB: {e}\n")
        sys.stderr.flush()
        os._exit(3)  # the other ranks wait in a collective: the launcher ends them
    result["data_limit"] = limit
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="one rank of bench_memory.py (launched by it)")
    p.add_argument("--layout", required=True, choices=sorted(ALL_LAYOUTS))
    for name in ("hidden", "layers", "heads", "intermediate", "vocab", "seq", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--result-dir", required=True)
    p.add_argument("--data-limit-mib", type=int, default=0,
                   help="RLIMIT_DATA of this rank in MiB (0: none): the memory budget Paddle's CPU allocator obeys")
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be at least 2 (the last step is measured after the optimizer state exists)")
    if a.data_limit_mib:
        result = run_within_data_limit(a)
    else:
        result = run(a)
    Path(a.result_dir, f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
