"""EvalAccumulator: the eval loss is weighted by batch size, a padding batch is not counted, and
metric keys get their prefix (one data rank; the multi-rank gathering is covered by tests/distributed)."""
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddletrainer.trainer_evaluation import EvalAccumulator

ONE_RANK = SimpleNamespace(data_world_size=1)


def test_loss_is_the_sample_weighted_mean_and_a_padding_batch_is_left_out():
    acc = EvalAccumulator(real_batches=2)
    acc.add(paddle.to_tensor(1.0), paddle.to_tensor([[1.0], [2.0], [3.0]]), paddle.to_tensor([1, 2, 3]), 3)
    acc.add(paddle.to_tensor(4.0), paddle.to_tensor([[4.0], [5.0]]), paddle.to_tensor([4, 5]), 2)  # short batch
    acc.add(paddle.to_tensor(100.0), paddle.to_tensor([[1.0]]), paddle.to_tensor([1]), 1)  # padding batch
    seen = {}

    def metrics(prediction):
        seen["shape"] = prediction.predictions.shape
        return {"accuracy": float((prediction.predictions[:, 0] == prediction.label_ids).mean()), "eval_already": 1}

    out = acc.finish(ONE_RANK, compute_metrics=metrics, metric_key_prefix="test")
    assert acc.batches == 3 and seen["shape"] == (5, 1) and out.num_samples == 5
    assert out.metrics["test_loss"] == pytest.approx((1.0 * 3 + 4.0 * 2) / 5)
    assert out.metrics["test_accuracy"] == 1.0 and "test_eval_already" in out.metrics
    np.testing.assert_array_equal(out.label_ids, [1, 2, 3, 4, 5])


def test_a_stream_padding_batch_known_only_at_the_end_is_left_out():
    shard_count = {"real": None}  # a stream shard learns its real batch count when the stream ends
    acc = EvalAccumulator(real_batches=lambda: shard_count["real"])
    acc.add(paddle.to_tensor(2.0), paddle.to_tensor([[1.0], [2.0]]), paddle.to_tensor([1, 2]), 2)
    acc.add(paddle.to_tensor(100.0), paddle.to_tensor([[1.0]]), paddle.to_tensor([1]), 1)  # padding batch
    shard_count["real"] = 1
    out = acc.finish(ONE_RANK)
    assert acc.batches == 2 and out.num_samples == 2 and out.metrics["eval_loss"] == pytest.approx(2.0)
    np.testing.assert_array_equal(out.label_ids, [1, 2])


def test_without_labels_there_is_no_loss_and_no_metrics_but_predictions():
    acc = EvalAccumulator()
    acc.add(None, paddle.ones([2, 3]), None, 2)
    out = acc.finish(ONE_RANK, compute_metrics=lambda p: {"never": 1})
    assert out.metrics == {} and out.label_ids is None and out.predictions.shape == (2, 3)


def test_eval_gathering_and_nested_concat_pad_later_axes_by_one_rule():
    import numpy as np

    from paddletrainer.data import interleave_rank_batches
    from paddletrainer.data.nested import concat_padded, nested_concat, nested_numpify

    short, long = np.ones((1, 2), np.int64), np.full((2, 4), 7, np.int64)
    expected = np.array([[1, 1, -100, -100], [7, 7, 7, 7], [7, 7, 7, 7]])
    assert (concat_padded([short, long]) == expected).all()
    assert (interleave_rank_batches([[short], [long]]) == expected).all()  # rank 0's batch, then rank 1's
    assert (nested_concat(short, long) == expected).all()
    assert (nested_concat(paddle.to_tensor(short), paddle.to_tensor(long)).numpy() == expected).all()
    bf16 = paddle.to_tensor([1.5, -2.0]).astype("bfloat16")
    assert nested_numpify((bf16,))[0].tolist() == [1.5, -2.0]  # the evaluation loop's one conversion
