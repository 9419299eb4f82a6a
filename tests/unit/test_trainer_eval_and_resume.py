"""One process: evaluation counts every sample exactly once, resuming with a larger max_steps trains to it,
and ``paddle.io.IterableDataset`` trains, evaluates and predicts."""
import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.data import EvalBatchSampler, IterableDatasetShard
from toy_models import RegressionModel, regression_data


def args_for(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                learning_rate=0.1, logging_steps=1, save_strategy="no", evaluation_strategy="no",
                disable_tqdm=True, report_to="none", seed=42, weight_decay=0.0, lr_scheduler_type="constant")
    base.update(kw)
    return TrainingArguments(**base)


def direct_losses_and_predictions(model, data):
    """Per-sample MSE and predictions of ``model`` over ``data``, computed without the Trainer."""
    x = paddle.to_tensor(np.stack([d["x"] for d in data]))
    y = np.array([d["labels"] for d in data])
    with paddle.no_grad():
        pred = model(x)[0].numpy()
    return (pred - y) ** 2, pred


@pytest.mark.parametrize("ranks,batch", [(1, 8), (4, 2), (3, 4), (2, 16)])
def test_eval_sampler_gives_every_sample_once_and_every_rank_the_same_number_of_batches(ranks, batch):
    n = 13
    samplers = [EvalBatchSampler(n, batch, r, ranks) for r in range(ranks)]
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1  # lockstep forward passes (sharding stage 3)
    real = [b[: s.num_real_batches] for b, s in zip(per_rank, samplers)]
    # interleaving batch k of rank 0, 1, ... is the dataset order, each index once
    order = [i for k in range(len(per_rank[0])) for r in range(ranks) if k < len(real[r]) for i in real[r][k]]
    assert order == list(range(n))


def test_eval_loss_over_an_awkward_size_is_the_mean_over_exactly_those_samples(tmp_path):
    paddle.seed(5)
    model = RegressionModel()
    data = regression_data(66, seed=3)  # 66 = 8 batches of 8 + 2: the last batch is short
    trainer = Trainer(model=model, args=args_for(tmp_path), eval_dataset=data)
    losses, preds = direct_losses_and_predictions(model, data)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(float(losses.mean()), rel=1e-6, abs=1e-7)
    out = trainer.predict(data)
    assert out.predictions.shape == (66,)
    np.testing.assert_allclose(out.predictions, preds, rtol=1e-6)
    assert out.metrics["test_loss"] == pytest.approx(float(losses.mean()), rel=1e-6, abs=1e-7)


def test_resume_with_a_larger_max_steps_trains_on_to_it_and_matches_the_uninterrupted_run(tmp_path):
    data = regression_data(64)

    def run(out, max_steps, resume=None):
        paddle.seed(11)
        args = args_for(tmp_path, output_dir=str(out), max_steps=max_steps, save_strategy="steps", save_steps=3,
                        overwrite_output_dir=True)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=data)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    _, full = run(tmp_path / "full", 6)
    run(tmp_path / "short", 3)
    extended, losses = run(tmp_path / "short", 6, resume=str(tmp_path / "short" / "checkpoint-3"))
    assert extended.state.global_step == 6 and extended.state.max_steps == 6
    assert losses == full  # steps 1-3 restored from the checkpoint, 4-6 trained again: bit-exact


class Stream(paddle.io.IterableDataset):
    """A paddle.io.IterableDataset over fixed samples (its ``__len__`` raises RuntimeError)."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        return iter(self.samples)


def test_paddle_iterable_dataset_trains_evaluates_and_predicts_every_item_once(tmp_path):
    paddle.seed(5)
    model = RegressionModel()
    train, evaluation = regression_data(64), regression_data(13, seed=4)  # 13 = 8 + a short batch of 5
    trainer = Trainer(model=model, args=args_for(tmp_path, max_steps=3), train_dataset=Stream(train),
                      eval_dataset=Stream(evaluation))
    assert trainer.train().global_step == 3
    losses, preds = direct_losses_and_predictions(model, evaluation)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(float(losses.mean()), rel=1e-6, abs=1e-7)
    out = trainer.predict(Stream(evaluation))
    np.testing.assert_allclose(out.predictions, preds, rtol=1e-6)


def test_an_eval_stream_shard_keeps_its_share_of_the_last_incomplete_block_and_pads_an_empty_one():
    stream = list(range(13))
    shards = [IterableDatasetShard(stream, 2, num_processes=4, process_index=r, keep_last=True) for r in range(4)]
    shares = [[x for x in shard] for shard in shards]
    assert shares == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12], [6, 7, 0]]  # rank 3's 0: its padding batch
    assert [shard.num_real_batches for shard in shards] == [2, 2, 2, 1]
    assert [x for x in IterableDatasetShard(stream, 2, True, 4, 2)] == [4, 5]  # training drops the incomplete block


@pytest.mark.parametrize("n,ranks,batch", [(13, 4, 2), (13, 1, 8), (16, 4, 2), (5, 4, 3), (1, 3, 2), (9, 2, 4)])
def test_eval_stream_shards_give_every_rank_the_same_number_of_batches_and_every_item_once(n, ranks, batch):
    shards = [IterableDatasetShard(range(n), batch, num_processes=ranks, process_index=r, keep_last=True)
              for r in range(ranks)]
    items = [[x for x in shard] for shard in shards]  # batched as the eval DataLoader does: batch_size items at a time
    per_rank = [[share[i:i + batch] for i in range(0, len(share), batch)] for share in items]
    assert len({len(b) for b in per_rank}) == 1  # lockstep forward passes (sharding stage 3)
    real = [b[: s.num_real_batches] for b, s in zip(per_rank, shards)]
    order = [i for k in range(len(per_rank[0])) for r in range(ranks) if k < len(real[r]) for i in real[r][k]]
    assert order == list(range(n))
