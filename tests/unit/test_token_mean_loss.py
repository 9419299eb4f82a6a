"""The loss of an optimizer step is the mean over every trained token of its global batch, and ``eval_loss`` the
mean over every trained token of the eval set: a tiny PaddleNLP Llama through the public Trainer, in one process,
on fine-tuning-shaped documents (4-16 positions, prompts labelled -100, right-padded; ``finetune_data``).

The reference holds the whole global batch (8 documents) in one micro-batch. The layouts' launches
(``tests/distributed/test_trainer_matrix.py``) compare every other layout with the same reference.
"""
import numpy as np
import paddle
import pytest

from finetune_data import direct_token_mean, finetune_samples, trained_tokens
from paddletrainer import Trainer, TrainingArguments
from paddletrainer.optim.loss import loss_items, micro_batch_weights
from paddletrainer.parallel.topology import Topology

STEPS, GLOBAL_BATCH = 3, 8
TRAIN, EVAL = finetune_samples(STEPS * GLOBAL_BATCH, 0), finetune_samples(13, 1)


def tiny_llama():
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16, seq_length=16,
                         rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                         tie_word_embeddings=False, dtype="float32")
    paddle.seed(2024)
    return LlamaForCausalLM(config)


def train(tmp_path, batch, accumulation, train_set=TRAIN, **options):
    """Logged losses, grad norms and the eval loss after ``STEPS`` steps of ``batch`` × ``accumulation``."""
    args = TrainingArguments(output_dir=str(tmp_path / f"b{batch}_ga{accumulation}"), max_steps=STEPS,
                             per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                             per_device_eval_batch_size=2, learning_rate=0.01, max_grad_norm=0.8,
                             lr_scheduler_type="constant", logging_steps=1, save_steps=100, seed=7,
                             disable_tqdm=True, report_to="none", **options)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=train_set, eval_dataset=EVAL)
    trainer.train()
    history = trainer.state.log_history
    weights = {k: v.numpy() for k, v in trainer.model.state_dict().items()}
    return ([h["loss"] for h in history if "loss" in h], [h["grad_norm"] for h in history if "grad_norm" in h],
            trainer.evaluate()["eval_loss"], weights)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, the whole global batch in one micro-batch."""
    return train(tmp_path_factory.mktemp("reference"), GLOBAL_BATCH, 1)


def test_the_fine_tuning_micro_batches_really_hold_different_token_counts():
    counts = [trained_tokens(TRAIN[i:i + 2]) for i in range(0, GLOBAL_BATCH, 2)]
    assert len(set(counts)) > 1, counts  # else the tests below would prove nothing


@pytest.mark.parametrize("batch,accumulation", [(4, 2), (2, 4)])
def test_gradient_accumulation_trains_fine_tuning_data_like_one_micro_batch(tmp_path, reference, batch, accumulation):
    # PaddleNLP's arithmetic (each micro-batch's mean / accumulation) is 1e-3 away by step 3
    losses, norms, eval_loss, _ = train(tmp_path, batch, accumulation)
    ref_losses, ref_norms, ref_eval, _ = reference
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert eval_loss == pytest.approx(ref_eval, rel=1e-5)


def test_eval_loss_is_the_mean_over_every_trained_token_of_the_eval_set(tmp_path):
    # 13 documents in batches of 2: a mean of the batches' means is 7e-4 away
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to="none",
                             disable_tqdm=True)
    model = tiny_llama()
    eval_loss = Trainer(model=model, args=args, eval_dataset=EVAL).evaluate()["eval_loss"]
    assert eval_loss == pytest.approx(direct_token_mean(model, EVAL), rel=1e-6)


def test_loss_average_micro_batch_keeps_paddlenlp_mean_of_micro_batch_means(tmp_path):
    losses = train(tmp_path, 4, 2, loss_average="micro_batch")[0]
    model = tiny_llama()  # the weights of step 1 (its loss is the forward before the update) and of the order
    args = TrainingArguments(output_dir=str(tmp_path / "order"), per_device_train_batch_size=4, seed=7,
                             gradient_accumulation_steps=2, per_device_eval_batch_size=2, report_to="none",
                             loss_average="micro_batch", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=TRAIN, eval_dataset=EVAL)
    first_step = [indices for _, indices in zip(range(2), trainer.get_train_dataloader().batch_sampler)]

    def mean_loss(samples):
        batch = {k: paddle.to_tensor(np.stack([s[k] for s in samples])) for k in ("input_ids", "labels")}
        with paddle.no_grad():
            return float(model(**batch)[0])

    model.eval()
    assert losses[0] == pytest.approx(np.mean([mean_loss([TRAIN[i] for i in idx]) for idx in first_step]), rel=1e-6)
    # and its eval loss: each batch's mean weighs as many samples as the batch holds (a mean of batch means)
    paddlenlp_eval = sum(mean_loss(EVAL[i:i + 2]) * len(EVAL[i:i + 2]) for i in range(0, 13, 2)) / 13
    assert trainer.evaluate()["eval_loss"] == pytest.approx(paddlenlp_eval, rel=1e-6)
    assert abs(paddlenlp_eval - direct_token_mean(model, EVAL)) > 1e-4  # the token mean is another number


def test_equal_token_counts_train_bit_for_bit_as_paddlenlp_arithmetic(tmp_path):
    # pretraining-shaped batches (every position trained): every weight is exactly 1.0, so the default path gives
    # the very bits of the per-micro-batch arithmetic (PaddleNLP's, and this Trainer's before the token mean)
    rng = np.random.RandomState(3)
    tokens = rng.randint(1, 96, size=(STEPS * GLOBAL_BATCH, 17)).astype("int64")
    pretrain = [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]
    exact = train(tmp_path / "exact", 4, 2, train_set=pretrain)
    paddlenlp = train(tmp_path / "paddlenlp", 4, 2, train_set=pretrain, loss_average="micro_batch")
    assert exact[:2] == paddlenlp[:2]  # losses and grad norms (the eval set is fine-tuning data: another mean)
    assert all(np.array_equal(exact[3][k], paddlenlp[3][k]) for k in exact[3])


def test_micro_batch_weights_are_each_share_of_the_global_count_and_exactly_one_when_equal():
    one = Topology.of()
    weights = micro_batch_weights([paddle.to_tensor(10, dtype="int64"), 30], 2, one)
    assert [float(w) for w in weights] == [0.5, 1.5]  # c·A/N: 10·2/40 and 30·2/40
    assert [float(w) for w in micro_batch_weights([7, 7, 7], 3, one)] == [1.0, 1.0, 1.0]
    assert [float(w) for w in micro_batch_weights([0, 0], 2, one)] == [0.0, 0.0]
    labels = np.array([[-100, 3, 4], [-100, -100, 5]])
    assert loss_items({"labels": labels}, ["labels"]) == 3
    assert int(loss_items({"labels": paddle.to_tensor(labels)}, ["labels"])) == 3
    assert loss_items({"input_ids": labels}, ["labels"]) == 2  # no labels: a loss per sample


class MaskedRegression(paddle.nn.Layer):
    """A loss averaged over a ``loss_mask``, not over labels: a user's model the default count does not know."""

    def __init__(self):
        super().__init__()
        paddle.seed(5)
        self.linear = paddle.nn.Linear(4, 1)

    def forward(self, x, labels, loss_mask):
        errors = (self.linear(x).squeeze(-1) - labels) ** 2
        return (errors * loss_mask).sum() / loss_mask.sum()


class CountsTheMask(Trainer):
    def count_loss_items(self, inputs):
        return inputs["loss_mask"].sum()


def test_a_user_loss_over_a_mask_opts_in_by_overriding_count_loss_items(tmp_path):
    rng = np.random.RandomState(0)
    data = [{"x": rng.randn(6, 4).astype("float32"), "labels": rng.randn(6).astype("float32"),
             "loss_mask": (np.arange(6) < rng.randint(1, 7)).astype("float32")} for _ in range(16)]

    def losses(trainer_class, batch, accumulation):
        args = TrainingArguments(output_dir=str(tmp_path / f"{trainer_class.__name__}{batch}"), max_steps=2,
                                 per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                                 learning_rate=0.1, logging_steps=1, save_steps=100, seed=1, report_to="none",
                                 disable_tqdm=True)
        trainer = trainer_class(model=MaskedRegression(), args=args, train_dataset=data)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    assert losses(CountsTheMask, 2, 4) == pytest.approx(losses(CountsTheMask, 8, 1), rel=1e-6)
    assert losses(Trainer, 2, 4) != pytest.approx(losses(Trainer, 8, 1), rel=1e-4)  # counted as labels: per micro-batch
