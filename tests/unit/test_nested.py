"""concat_padded, the one concatenation with -100 padding on later axes (nested_concat and the eval gathering)."""
import numpy as np
import paddle
import pytest

from paddletrainer.data.gather import interleave_rank_batches
from paddletrainer.data.nested import concat_padded
from paddletrainer.utils.helper import nested_concat


def test_bfloat16_tensors_of_different_lengths_keep_their_dtype_and_values():
    a = paddle.full([1, 2], 1.5, dtype="bfloat16")
    b = paddle.full([2, 3], 2.5, dtype="bfloat16")
    joined = nested_concat(a, b)
    assert joined.dtype == paddle.bfloat16 and joined.shape == [3, 3]
    np.testing.assert_array_equal(joined.astype("float32").numpy(),
                                  [[1.5, 1.5, -100], [2.5, 2.5, 2.5], [2.5, 2.5, 2.5]])


def test_every_later_axis_is_padded_and_the_gathering_keeps_dataset_order():
    rank0 = [np.full((2, 1, 3), 0), np.full((1, 2, 1), 2)]  # blocks 0 and 1 of rank 0
    rank1 = [np.full((2, 2, 2), 1)]  # rank 1 had no batch in block 1
    out = interleave_rank_batches([rank0, rank1])
    assert out.shape == (5, 2, 3) and out.dtype == np.int64
    assert out[:, 0, 0].tolist() == [0, 0, 1, 1, 2]
    assert out[0].tolist() == [[0, 0, 0], [-100, -100, -100]] and out[4].tolist() == [[2, -100, -100], [2, -100, -100]]
    assert concat_padded([np.zeros((1, 2)), np.ones((1, 2))]).tolist() == [[0, 0], [1, 1]]


def test_outputs_with_different_numbers_of_axes_are_refused_with_their_shapes():
    with pytest.raises(ValueError, match=r"different numbers of axes: shapes \[\[2, 3\], \[1, 3, 4\]\]; every batch"):
        nested_concat(np.zeros((2, 3)), np.zeros((1, 3, 4)))
