"""Shared pieces of the distributed test workers: the layout arguments, tiny models, fixed data, the
options of the Trainer workers and their parsing."""
from __future__ import annotations

import faulthandler
import json
import os
from dataclasses import dataclass, field

import numpy as np

GLOBAL_BATCH = 8  # samples per optimizer step, for every layout
SEQ = 16
VOCAB = 96


def layout_args(dp=1, sharding=1, tp=1, pp=1, stage=0, offload=False, ga=2, seed=42):
    """The ParallelConfig (what init_topology and parallelize take) of a layout, with its micro-batch size."""
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.layout import Layout

    micro_global = GLOBAL_BATCH // ga
    if micro_global % (dp * sharding):
        raise ValueError(f"global micro-batch {micro_global} does not split over {dp * sharding} data ranks")
    layout = Layout(world_size=dp * sharding * tp * pp, dp=dp, sharding=sharding, tp=tp, pp=pp)
    return ParallelConfig(layout=layout, sharding_stage=stage if sharding > 1 else 0, sharding_offload=offload,
                          accumulate_steps=ga, micro_batch_size=micro_global // (dp * sharding), seed=seed)


@dataclass
class TrainerWorkerArguments:
    """The worker options of every Trainer worker (``trainer_worker.py`` and the workers built on it,
    ``trainer_phases_worker.py``): which model, its weights, the train set size, where results go."""

    model: str = field(default="mlp", metadata={"help": "mlp | llama"})
    weights: str = field(default=None, metadata={"help": "tiny Llama directory (from_pretrained)"})
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    num_samples: int = field(default=64, metadata={"help": "train set size"})
    fuse_attention_qkv: bool = field(default=False, metadata={"help": "Llama: one fused q/k/v projection"})
    fuse_attention_ffn: bool = field(default=False, metadata={"help": "Llama: one fused gate/up projection"})
    finetune: str = field(default="", metadata={"help": "Llama: also train on fine-tuning documents, once per "
                                                        "comma-separated accumulation ('own': the launch's own)"})


def parse_worker_arguments(*worker_dataclasses):
    """Arm the hang dump, then parse the command line as a training script does: the given worker dataclasses
    plus every ``TrainingArguments`` option (``PdArgumentParser``). Returns one instance per dataclass,
    the ``TrainingArguments`` last.

    A worker that hangs past ``PT_WORKER_TIMEOUT`` seconds (default 280) prints every Python stack and exits,
    so the launcher reports where it stuck instead of timing out silently.
    """
    from paddletrainer import PdArgumentParser, TrainingArguments

    faulthandler.enable()  # a native crash (segfault/abort) prints the Python stacks too
    faulthandler.dump_traceback_later(int(os.environ.get("PT_WORKER_TIMEOUT", "280")), exit=True)
    return PdArgumentParser((*worker_dataclasses, TrainingArguments)).parse_args_into_dataclasses()


def token_data(steps):
    """input_ids / labels for ``steps`` global batches (labels are the next tokens)."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, VOCAB, size=(steps * GLOBAL_BATCH, SEQ + 1)).astype("int64")
    return tokens[:, :-1], tokens[:, 1:]


def regression_data(steps):
    rng = np.random.RandomState(0)
    x = rng.randn(steps * GLOBAL_BATCH, 8).astype("float32")
    y = rng.randn(steps * GLOBAL_BATCH, 1).astype("float32")
    return x, y


def micro_batches(arrays, step, ga, data_rank, data_world):
    """This data rank's slices of the ``ga`` micro-batches of global step ``step``.

    Micro-step m of the step covers samples [m·B·W, (m+1)·B·W) of the step's global batch and data rank
    r takes [r·B, (r+1)·B) of it (B = per-rank micro-batch, W = data world size).
    """
    per_micro = GLOBAL_BATCH // ga
    b = per_micro // data_world
    out = []
    for m in range(ga):
        start = step * GLOBAL_BATCH + m * per_micro + data_rank * b
        out.append(tuple(a[start:start + b] for a in arrays))
    return out


def max_abs_error(a, b) -> float:
    """Largest absolute difference, computed in float64 (the tests' 1e-5 bar is about the float32 values)."""
    return float(np.max(np.abs(np.asarray(a, dtype="float64") - np.asarray(b, dtype="float64"))))


def leaf(array):
    """A tensor that collects a gradient (the op tests compare input gradients with single-process math)."""
    import paddle

    tensor = paddle.to_tensor(array)
    tensor.stop_gradient = False
    return tensor


def write_json(path, payload):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def tiny_llama_config():
    from paddlenlp.transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                       seq_length=SEQ, rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                       fuse_attention_qkv=False, fuse_attention_ffn=False, tie_word_embeddings=False,
                       dtype="float32")


def exit_cleanly(topology):
    """Wait for every rank, then end the process without running C++ destructors.

    Paddle's gloo process groups and TCP stores are torn down at interpreter exit in no fixed order
    across processes; in about one 16-process run in three a rank died there (exit -15 / 245, no
    traceback) after writing its results. Every result is on disk when this runs.
    """
    import sys

    import paddle.distributed as dist

    if topology.world_size > 1:
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
