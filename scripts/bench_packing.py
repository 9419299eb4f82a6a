"""Packed rows against padded samples on the same fine-tuning data, and the CPU FlashMask attention's memory.

1. Throughput: the same tokenized documents (lengths uniform in [S/16, S], the first quarter of each a prompt
   labelled -100) trained through the public Trainer on a small PaddleNLP Llama, one process on CPU, three ways:
   one document per sample right-padded to S (``DataCollatorWithPadding``), and packed into rows of S by
   ``paddletrainer.data.pack_dataset`` with FlashMask's document ends (the CPU FlashMask attention) or with the
   block-diagonal ``attention_mask`` (PaddleNLP's math attention with the mask). Same rows per step; the table
   gives the logged ``tokens_per_second`` (every position, padding included) and ``trained_tokens_per_second``
   (labels not -100), medians over the steps after the first, the steps an epoch of the documents takes and the
   trained share of an epoch's positions.
2. Memory at S = 4096 (one process per measurement, peak RSS above the process's RSS before the call): forward and
   backward of one attention call ``[1, S, heads, 64]`` over packed documents, by the CPU FlashMask attention
   (``paddletrainer.parallel.flashmask``, key blocks of 128) and by math attention with the S×S additive mask
   PaddleNLP builds for the ``attention_mask`` format.

    python scripts/bench_packing.py --tiny
    python scripts/bench_packing.py --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (PYTHON, fmt_bytes, machine_line, markdown_table, median, peak_rss_bytes,  # noqa: E402
                          peak_rss_reset, print_table, update_markdown_section)

SHAPES = {"tiny": dict(hidden=64, layers=2, heads=4, inter=128, vocab=512, seq=128, docs=96, batch=4, steps=4,
                       memory_seq=512),
          "small": dict(hidden=256, layers=4, heads=4, inter=688, vocab=4000, seq=512, docs=600, batch=4, steps=8,
                        memory_seq=4096)}
THROUGHPUT_HEADERS = ["data", "rows", "steps/epoch", "tokens/s", "trained tokens/s", "trained share",
                      "trained tokens/s vs padded"]
MEMORY_HEADERS = ["attention (S, heads, head dim)", "peak RSS above start", "vs S×S mask"]


def documents(shape, seed=0):
    import numpy as np

    rng = np.random.RandomState(seed)
    seq, docs = shape["seq"], []
    for _ in range(shape["docs"]):
        n = int(rng.randint(seq // 16, seq + 1))
        ids = rng.randint(1, shape["vocab"], size=n)
        prompt = n // 4
        docs.append({"input_ids": ids.tolist(), "labels": [-100] * prompt + ids[prompt:].tolist()})
    return docs


def train_once(shape, dataset, collator, out_dir):
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    from paddletrainer import Trainer, TrainingArguments

    paddle.seed(0)
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["inter"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         max_position_embeddings=shape["seq"], use_flash_attention=False)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=shape["batch"], max_steps=shape["steps"],
                             logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False, learning_rate=1e-3)
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tokens_per_second" in h][1:]
    return median(h["tokens_per_second"] for h in logs), median(h["trained_tokens_per_second"] for h in logs)


def throughput_rows(shape):
    from paddletrainer.data import pack_dataset
    from paddletrainer.data.collate import DataCollatorWithPadding

    docs = documents(shape)
    padded = [dict(d) for d in docs]
    runs = [("padded (one document per sample)", padded, DataCollatorWithPadding(padding="max_length",
                                                                                 max_length=shape["seq"]))]
    for mask_format, name in (("startend", "packed, attn_mask_startend_row_indices"),
                              ("attention_mask", "packed, block-diagonal attention_mask")):
        runs.append((name, pack_dataset(docs, shape["seq"], mask_format=mask_format),
                     DataCollatorWithPadding(padding="max_length", max_length=shape["seq"])))
    rows, base = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name, dataset, collator in runs:
            tps, trained = train_once(shape, dataset, collator, tmp)
            base = base or trained
            steps = -(-len(dataset) // shape["batch"])
            labelled = sum(sum(1 for label in dataset[i]["labels"] if label != -100) for i in range(len(dataset)))
            share = labelled / (len(dataset) * shape["seq"])  # of the positions an epoch trains, padding included
            rows.append([name, len(dataset), steps, tps, trained, f"{share:.0%}", f"{trained / base:.2f}x"])
    return rows


def measure_attention(kind, seq, heads, dim=64):
    """One forward + backward of ``kind`` (flashmask | mask) on packed documents of 256 tokens: peak RSS bytes
    above the RSS before the call (this process only)."""
    import numpy as np
    import paddle

    from paddletrainer.parallel.flashmask import flashmask_attention

    rng = np.random.RandomState(0)
    q, k, v = (paddle.to_tensor(rng.randn(1, seq, heads, dim).astype("float32")) for _ in range(3))
    for t in (q, k, v):
        t.stop_gradient = False
    positions = np.arange(seq)
    ends = ((positions // 256 + 1) * 256).clip(max=seq)[None]
    if kind == "mask":
        keep = (positions[None, :] <= positions[:, None]) & (positions[:, None] < ends[0][None, :])
        additive = paddle.to_tensor(np.where(keep, 0.0, np.finfo("float32").min).astype("float32")[None, None])
    with open("/proc/self/status") as f:
        start = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    peak_rss_reset()
    if kind == "flashmask":
        out = flashmask_attention(q, k, v, paddle.to_tensor(ends.astype("int32")))
    else:
        qh, kh, vh = (paddle.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        scores = paddle.matmul(qh, kh, transpose_y=True) / dim ** 0.5 + additive
        out = paddle.matmul(paddle.nn.functional.softmax(scores, -1), vh)
    out.sum().backward()
    return peak_rss_bytes() - start


def memory_rows(shape):
    seq, heads = shape["memory_seq"], shape["heads"]
    measured = {}
    for kind in ("flashmask", "mask"):
        proc = subprocess.run([PYTHON, __file__, "--measure", kind, "--seq", str(seq), "--heads", str(heads)],
                              capture_output=True, text=True, check=True)
        measured[kind] = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    label = f"({seq}, {heads}, 64)"
    return [[f"CPU FlashMask attention {label}", fmt_bytes(measured["flashmask"]),
             f"{measured['flashmask'] / measured['mask']:.2f}x"],
            [f"math attention + S×S mask {label}", fmt_bytes(measured["mask"]), "1.00x"]]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny model, S=128, memory at S=512 (the smoke test)")
    p.add_argument("--markdown", action="store_true", help="replace this benchmark's section of docs/benchmarks.md")
    p.add_argument("--measure", choices=("flashmask", "mask"), help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    p.add_argument("--heads", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        print(json.dumps({"peak": measure_attention(a.measure, a.seq, a.heads)}))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    shape = SHAPES["tiny" if a.tiny else "small"]
    throughput = throughput_rows(shape)
    memory = memory_rows(shape)
    title = f"Packed rows vs padded samples (S={shape['seq']}, {shape['docs']} documents)"
    print_table(title, THROUGHPUT_HEADERS, throughput)
    print_table(f"Attention memory at S={shape['memory_seq']}", MEMORY_HEADERS, memory)
    if a.markdown:
        body = (f"Measured {machine_line()}, `python scripts/bench_packing.py --markdown`: one process, a Llama of "
                f"hidden {shape['hidden']}, {shape['layers']} layers, {shape['heads']} heads, batch "
                f"{shape['batch']} rows, medians of steps 2-{shape['steps']}.\n\n"
                + markdown_table(THROUGHPUT_HEADERS, throughput)
                + "\n\nThe exact part of the gain is the epoch: fewer steps for the same documents and a larger trained "
                  "share of the positions. The per-step rates follow the machine's load (a shared CPU machine: see "
                  "the load above), so compare them only within one run.\n\nForward and backward of one attention call over packed 256-token documents, each in its own "
                  "process (peak RSS above the RSS before the call):\n\n"
                + markdown_table(MEMORY_HEADERS, memory))
        update_markdown_section("Packed sequences (bench_packing.py)", body)


if __name__ == "__main__":
    main()
