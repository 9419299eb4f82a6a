"""The global data order depends only on seed and global batch size, never on the layout."""
import numpy as np
import pytest

from paddletrainer.data import (
    DataCollatorWithPadding,
    GlobalBatchSampler,
    IterableDatasetShard,
    default_data_collator,
)


def step_samples(n, batch, ga, world, seed=3, drop_last=False):
    """The set of samples each optimizer step trains on, gathered over all data ranks."""
    samplers = [
        GlobalBatchSampler(n, batch, r, world, seed=seed, drop_last=drop_last, step_span=batch * ga * world)
        for r in range(world)
    ]
    per_rank = [list(s) for s in samplers]
    steps = []
    for k in range(0, len(per_rank[0]), ga):
        steps.append(sorted(i for r in range(world) for mb in per_rank[r][k : k + ga] for i in mb))
    return steps


def test_one_process_batch8_and_dp2_batch4_see_the_same_samples_every_step():
    assert step_samples(37, 8, 1, 1) == step_samples(37, 4, 1, 2)


def test_gradient_accumulation_and_dp4_cover_the_same_global_batches():
    ref = step_samples(50, 8, 1, 1)
    assert step_samples(50, 2, 4, 1) == ref
    assert step_samples(50, 1, 2, 4) == ref


def test_incomplete_last_step_is_padded_by_wraparound_or_dropped():
    padded = step_samples(10, 4, 1, 1)
    assert len(padded) == 3 and len(padded[-1]) == 4
    dropped = step_samples(10, 4, 1, 1, drop_last=True)
    assert len(dropped) == 2


def test_resume_skips_by_sample_index_to_the_same_batches():
    full = list(GlobalBatchSampler(40, 4, seed=1))
    s = GlobalBatchSampler(40, 4, seed=1)
    s.set_epoch(0, consumed_in_epoch=12)
    assert list(s) == full[3:]
    assert len(s) == len(full) - 3


def test_epochs_reshuffle_and_are_reproducible():
    a, b = GlobalBatchSampler(20, 5, seed=7), GlobalBatchSampler(20, 5, seed=7)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first


def test_empty_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        GlobalBatchSampler(0, 4)


def test_iterable_shard_splits_blocks_over_ranks_and_skips_on_resume():
    stream = list(range(20))
    # (a comprehension, not list(): paddle's IterableDataset raises on the __len__ hint list() asks for)
    r0 = [x for x in IterableDatasetShard(stream, 2, True, 2, 0)]
    r1 = [x for x in IterableDatasetShard(stream, 2, True, 2, 1)]
    assert r0[:4] == [0, 1, 4, 5] and r1[:4] == [2, 3, 6, 7]
    assert [x for x in IterableDatasetShard(stream, 2, True, 2, 0, skip_items=8)][:2] == [8, 9]


def test_collators_stack_rename_labels_and_pad():
    batch = default_data_collator([{"x": [1.0, 2.0], "label": 1, "text": "a"}, {"x": [3.0, 4.0], "label": 0, "text": "b"}])
    assert set(batch) == {"x", "labels"} and batch["labels"].dtype == np.int64

    class Tok:
        pad_token_id = 9

    padded = DataCollatorWithPadding(Tok())([{"input_ids": [1, 2, 3], "labels": 1}, {"input_ids": [4], "labels": 0}])
    assert padded["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
