"""Fine-tuning-shaped data for the tiny Llama (vocabulary 96, 16 positions) and its loss computed without the
Trainer: shared by the single-process tests (``test_token_mean_loss.py``) and the layout launches
(``tests/distributed/workers/trainer_phases_worker.py``).

A document has 4-16 positions; its first ``prompt`` labels are -100 (the prompt is not trained), the rest are the
next tokens; it is right-padded to 16 positions (input 0, label -100). So micro-batches of the same number of
documents hold different numbers of trained tokens: 2 to 15 per document.
"""
from __future__ import annotations

import numpy as np

SEQ, VOCAB, IGNORE = 16, 96, -100


def finetune_samples(n: int, seed: int, seq: int = SEQ, vocab: int = VOCAB):
    """``n`` documents as ``{"input_ids", "labels"}`` samples of ``seq`` positions (see the module docstring)."""
    rng = np.random.RandomState(seed)
    samples = []
    for _ in range(n):
        length = int(rng.randint(4, seq + 1))
        prompt = int(rng.randint(1, length - 1))
        tokens = rng.randint(1, vocab, size=length + 1).astype("int64")
        input_ids = np.zeros([seq], dtype="int64")
        labels = np.full([seq], IGNORE, dtype="int64")
        input_ids[:length] = tokens[:length]
        labels[prompt:length] = tokens[prompt + 1:length + 1]
        samples.append({"input_ids": input_ids, "labels": labels})
    return samples


def trained_tokens(samples) -> int:
    return int(sum(np.count_nonzero(s["labels"] != IGNORE) for s in samples))


def direct_token_mean(model, samples) -> float:
    """The mean over every trained token of ``samples`` of its cross-entropy, each document run alone and
    unpadded, the log-softmax taken in float64 here: no Trainer, no batching, no criterion of the model's."""
    import paddle

    model.eval()
    total, count = 0.0, 0
    with paddle.no_grad():
        for sample in samples:
            length = int(np.nonzero(sample["input_ids"])[0].max()) + 1
            out = model(input_ids=paddle.to_tensor(sample["input_ids"][None, :length]))
            logits = (out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)).numpy()[0]
            logits = logits.astype("float64")
            labels = sample["labels"][:length]
            trained = labels != IGNORE
            shifted = logits - logits.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            total -= float(log_probs[trained, labels[trained]].sum())
            count += int(trained.sum())
    return total / count
