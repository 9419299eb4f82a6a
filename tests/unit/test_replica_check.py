"""The replica-divergence check's parts that need no second process: the bit-exact fingerprint, the verdict over
a gathered table, which tensors are compared, the option. The launches (dp2, sharding stage 1) are
tests/distributed/test_replica_divergence.py."""
import numpy as np
import paddle
import pytest

from paddletrainer import TrainingArguments
from paddletrainer.config.builders import ReplicaCheckConfig
from paddletrainer.parallel import Topology
from paddletrainer.runtime.replica_check import ReplicaCheck, first_divergence, fingerprint, replicated_tensors

BITS = {"float32": ("int32", 32), "bfloat16": ("int16", 16), "float16": ("int16", 16)}


@pytest.mark.parametrize("dtype", sorted(BITS))
def test_one_flipped_bit_in_any_position_changes_the_fingerprint_and_equal_tensors_agree(dtype):
    as_int, width = BITS[dtype]
    x = paddle.randn([3, 5]).astype(dtype)
    same = x.clone()
    assert (fingerprint([x]).numpy() == fingerprint([same]).numpy()).all()
    base = fingerprint([x]).numpy()
    bits = x.flatten().view(as_int).numpy().copy()
    for element in (0, 7, 14):
        for bit in range(width):
            flipped = bits.copy()
            flipped[element] ^= np.array(1 << bit).astype(flipped.dtype)  # the sign bit too
            y = paddle.to_tensor(flipped).view(dtype).reshape([3, 5])
            assert (fingerprint([y]).numpy()[0] != base[0]).any(), (dtype, element, bit)


def test_the_fingerprint_has_one_row_per_tensor_and_reads_bits_not_values():
    zero, negative_zero = paddle.to_tensor([0.0, 1.0]), paddle.to_tensor([-0.0, 1.0])
    table = fingerprint([zero, negative_zero, paddle.to_tensor(2.0), paddle.zeros([0]), paddle.to_tensor([3, 4])])
    assert table.dtype == paddle.int64 and table.shape == [5, 2]
    assert (table[0] != table[1]).any()  # equal values, different bits: not the same replica
    assert table[4].numpy().tolist() == [7, 25]  # integer tensors are summed as values
    assert fingerprint([]).shape == [0, 2]


def test_first_divergence_names_the_first_parameter_and_the_ranks_outside_a_strict_majority():
    agree = np.zeros((3, 4, 2), dtype=np.int64)
    assert first_divergence(agree) is None
    table = agree.copy()
    table[1, 2, 0] = 5  # replica 1 differs in parameter 2 (and 3)
    table[1, 3, 1] = 5
    assert first_divergence(table) == (2, [1], [0, 2])
    two = np.zeros((2, 3, 2), dtype=np.int64)
    two[1, 1, 1] = -1
    assert first_divergence(two) == (1, [0, 1], [])  # two replicas: no majority, neither can be blamed
    four = np.zeros((4, 1, 2), dtype=np.int64)
    four[2:, 0, 0] = 1
    assert first_divergence(four) == (0, [0, 1, 2, 3], [])  # a 2-2 split neither


def test_stage_3_compares_the_slice_a_parameter_keeps_and_skips_released_ones():
    model = paddle.nn.Linear(2, 3)
    sliced = paddle.to_tensor([1.0, 2.0])
    model.weight.fw_storage = sliced
    names, tensors = replicated_tensors(model, sharding_stage=3)
    assert names == ["weight", "bias"] and tensors[0] is sliced and tensors[1] is model.bias
    names, tensors = replicated_tensors(model, sharding_stage=1)
    assert tensors[0] is model.weight  # stage 1/2: every rank holds the full parameter after the step


def test_without_a_replica_the_check_is_never_due():
    one = ReplicaCheck(ReplicaCheckConfig(every_steps=2), Topology.of(), paddle.nn.Linear(2, 2))
    assert one.every == 0 and not any(one.due(s) for s in range(1, 10))


def test_the_option_builds_the_config_and_refuses_a_negative_value(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path))
    assert args.replica_check_config == ReplicaCheckConfig(every_steps=100, sharding_stage=0)
    assert TrainingArguments(output_dir=str(tmp_path), replica_check_steps=0).replica_check_config.every_steps == 0
    with pytest.raises(ValueError, match=r"^replica_check_steps=-1 is invalid: must be >= 0 \(an interval in steps; 0 turns the replica check off\)$"):
        TrainingArguments(output_dir=str(tmp_path), replica_check_steps=-1)
