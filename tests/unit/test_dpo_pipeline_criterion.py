"""The pipeline DPO criterion on one process (no launch): ``DPOCriterion(use_infohub=True)``, the loss function of
a Pipe model's last stage, returns one loss and keeps what the plain criterion returns, as PaddleNLP's keeps them
in its infohub; DPO micro-batches are split between the stages as PaddleNLP splits them. The pipeline runs
themselves (pp2·GA2 train, evaluate, predict against one process) are in tests/distributed/test_dpo_layouts.py."""
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddletrainer.trl import DPOConfig, DPOCriterion
from paddletrainer.trl.dpo_pipeline import dpo_pipeline_inputs, install_dpo_criterion

VOCAB, LENGTH = 11, 14
CONFIG = SimpleNamespace(tensor_parallel_output=False, tensor_parallel_degree=1)
INFO_KEYS = ("reference_chosen_logps", "reference_rejected_logps", "policy_chosen_logps", "policy_rejected_logps",
             "sft_loss", "dpo_loss")


def pair_labels(seed=0):
    """Two rows: row 0 holds pairs at [2, 5, 8) and [8, 10, 13), row 1 one pair at [3, 7, 12)."""
    rng = np.random.RandomState(seed)
    chosen, rejected = np.zeros([2, LENGTH], "int64"), np.zeros([2, LENGTH], "int64")
    spans = [[0, 2, 5, 8], [0, 8, 10, 13], [1, 3, 7, 12]]
    for row, start, mid, end in spans:
        chosen[row, start:mid] = rng.randint(1, VOCAB, mid - start)
        rejected[row, mid:end] = rng.randint(1, VOCAB, end - mid)
    return paddle.to_tensor(chosen), paddle.to_tensor(rejected), paddle.to_tensor(np.array(spans, "int64"))


def logits(seed):
    return paddle.to_tensor(np.random.RandomState(seed).randn(2, LENGTH, VOCAB).astype("float32"))


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_the_pipeline_criterion_returns_the_loss_and_keeps_what_the_plain_criterion_returns(loss_type):
    config = DPOConfig(beta=0.5, loss_type=loss_type, sft_loss_ratio=0.3)
    plain = DPOCriterion(CONFIG, dpo_config=config, ignore_eos_token=True)
    hub = DPOCriterion(CONFIG, dpo_config=config, ignore_eos_token=True, use_infohub=True)
    labels = pair_labels()
    reference = plain(logits(1), labels + (None, None))
    assert float(hub(logits(1), labels + (None, None)).sum()) == 0.0
    expected = plain(logits(2), labels + reference)
    loss = hub(logits(2), labels + reference)
    np.testing.assert_allclose(loss.numpy(), expected[-1].numpy(), rtol=1e-6)
    ref_record, policy_record = hub.records
    for mine, theirs in zip(ref_record + policy_record, reference + expected[:4]):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6)


def test_the_pipeline_criterion_keeps_what_paddlenlps_keeps_in_its_infohub():
    from paddlenlp.transformers.dpo_criterion import DPOCriterion as PaddleNLPCriterion
    from paddlenlp.utils import infohub

    config = DPOConfig(beta=0.5)
    theirs = PaddleNLPCriterion(CONFIG, dpo_config=config, use_infohub=True)
    mine = DPOCriterion(CONFIG, dpo_config=config, use_infohub=True)
    for key in INFO_KEYS:
        setattr(infohub, key, [])
    labels = pair_labels(3)
    for criterion in (theirs, mine):
        criterion(logits(4), labels + (None, None))
    reference = mine.records[0]
    np.testing.assert_allclose(mine(logits(5), labels + reference).numpy(),
                               theirs(logits(5), labels + reference).numpy(), rtol=1e-6)
    kept = [infohub.reference_chosen_logps[0], infohub.reference_rejected_logps[0], infohub.policy_chosen_logps[0],
            infohub.policy_rejected_logps[0], infohub.sft_loss[0], infohub.dpo_loss[0]]
    for ours, paddlenlps in zip(mine.records[0] + mine.records[1], kept):
        np.testing.assert_allclose(ours.numpy(), paddlenlps.numpy(), rtol=1e-6)


def test_dpo_micro_batches_are_split_between_the_stages_as_paddlenlp_splits_them():
    from paddlenlp.trl.dpo_trainer import prepare_pipeline_dpo_inputs_func

    chosen, rejected, spans = pair_labels()
    batch = {"input_ids": paddle.ones([2, LENGTH], "int64"), "position_ids": paddle.zeros([2, LENGTH], "int64"),
             "attention_mask": paddle.ones([2, 1, LENGTH, LENGTH], "bool"), "chosen_labels": chosen,
             "rejected_labels": rejected, "response_indexs": spans, "reference_chosen_logps": None,
             "reference_rejected_logps": paddle.zeros([3])}
    ours = dpo_pipeline_inputs(batch)
    theirs = prepare_pipeline_dpo_inputs_func(dict(batch))
    for mine, paddlenlps in zip(ours, theirs):
        assert [id(x) for x in mine] == [id(x) for x in paddlenlps]


def test_a_criterion_that_returns_log_probs_is_refused_as_a_pipeline_loss():
    with pytest.raises(ValueError, match="use_infohub=True"):
        install_dpo_criterion(paddle.nn.Linear(2, 2), DPOCriterion(CONFIG, dpo_config=DPOConfig()))
