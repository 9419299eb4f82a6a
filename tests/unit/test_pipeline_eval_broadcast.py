"""Pipeline evaluation hands every pp rank the last stage's loss and logits through one header + data
broadcast; a failure on the last stage must reach every rank instead of leaving them waiting.

``paddle.distributed.broadcast`` is replaced by a recorder: the sender's broadcasts are captured and
replayed into a receiver, so both sides of the protocol run in one process."""
from types import SimpleNamespace

import paddle
import pytest

from paddletrainer.parallel import pipeline

GROUP = SimpleNamespace(ranks=[3, 7])  # the last rank (7) is the source


def sender_then_receiver(monkeypatch, tensor, error=None):
    sent = []
    monkeypatch.setattr(paddle.distributed, "broadcast", lambda t, src, group: sent.append(t.clone()))
    try:
        out = pipeline._broadcast_from_last_stage(tensor, GROUP, error)
    except Exception as exc:  # noqa: BLE001 - the sender's own error, re-raised
        out = exc
    replay = iter(sent)

    def receive(t, src, group):
        assert src == 7
        paddle.assign(next(replay), t)

    monkeypatch.setattr(paddle.distributed, "broadcast", receive)
    try:
        received = pipeline._broadcast_from_last_stage(None, GROUP)
    except Exception as exc:  # noqa: BLE001
        received = exc
    return out, received, len(sent)


def test_logits_reach_the_other_ranks_with_their_shape(monkeypatch):
    logits = paddle.arange(24, dtype="float32").reshape([2, 3, 4])
    out, received, broadcasts = sender_then_receiver(monkeypatch, logits)
    assert out is logits and broadcasts == 2
    assert received.shape == [2, 3, 4] and (received.numpy() == logits.numpy()).all()


def test_a_scalar_loss_and_a_missing_loss_both_arrive(monkeypatch):
    _, received, _ = sender_then_receiver(monkeypatch, paddle.to_tensor(1.5))
    assert received.shape == [] and float(received) == 1.5
    _, received, broadcasts = sender_then_receiver(monkeypatch, None)
    assert received is None and broadcasts == 1  # header only


def test_a_last_stage_error_is_raised_on_every_rank(monkeypatch):
    boom = TypeError("last stage returned two tensors")
    out, received, broadcasts = sender_then_receiver(monkeypatch, None, error=boom)
    assert out is boom and broadcasts == 1
    assert isinstance(received, RuntimeError) and "last stage (global rank 7)" in str(received)


def test_the_last_stage_refuses_outputs_it_cannot_turn_into_logits():
    model = SimpleNamespace(_layers=SimpleNamespace(_loss_fn=[None]))
    with pytest.raises(TypeError, match="prediction_loss_only=True"):
        pipeline._last_stage_loss_and_logits(model, [(paddle.ones([1, 2]), paddle.ones([1]))], [None])


def test_the_last_stage_loss_is_the_mean_over_micro_batches_and_logits_concatenate():
    mse = SimpleNamespace(_layers=SimpleNamespace(_loss_fn=[lambda out, lab: ((out - lab) ** 2).mean()]))
    outs = [paddle.zeros([2, 3]), paddle.ones([1, 3])]
    labels = [paddle.ones([2, 3]), paddle.ones([1, 3])]  # losses 1 and 0
    loss, logits = pipeline._last_stage_loss_and_logits(mse, outs, labels)
    assert float(loss) == pytest.approx(0.5) and logits.shape == [3, 3]
    loss, _ = pipeline._last_stage_loss_and_logits(mse, outs, [None, None])
    assert loss is None
