"""Token accounting of a fine-tuning run (PaddleNLP's ``calculate_effective_tokens``)."""
from __future__ import annotations

__all__ = ["calculate_effective_tokens"]


def calculate_effective_tokens(training_args, train_dataset, max_seq_len):
    """``(effective, total)``: the tokens of the examples a run trains on, and the tokens the rows hold when each
    is padded to ``max_seq_len`` (``max_steps`` × the global batch when ``max_steps > 0``, else every example of
    every epoch)."""
    dp = getattr(training_args, "data_parallel_degree", 1) or 1
    sharding = max(getattr(training_args, "sharding_parallel_degree", 1) or 1, 1)
    if training_args.max_steps > 0:
        rows = (training_args.max_steps * training_args.per_device_train_batch_size
                * training_args.gradient_accumulation_steps * sharding * dp)
        effective = 0
        for i, example in enumerate(train_dataset):
            if i == rows:
                break
            effective += len(example["input_ids"])
        return effective, rows * max_seq_len
    effective, rows = 0, 0
    for example in train_dataset:
        effective += len(example["input_ids"])
        rows += 1
    epochs = training_args.num_train_epochs
    return effective * epochs, rows * max_seq_len * epochs
