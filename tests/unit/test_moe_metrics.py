"""MoE metrics: a layer's statistics pooled over the logging window, and the Trainer logging a model's
``extra_metrics()`` with the loss (how the MoE example reports expert load)."""
import numpy as np
import paddle

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.moe import MoELayer
from paddletrainer.moe.stats import moe_metrics

H = 4


class MoERegression(paddle.nn.Layer):
    """y = w · MoE(x): a regression through one MoE layer; ``extra_metrics`` as the MoE example has it."""

    def __init__(self):
        super().__init__()
        self.moe = MoELayer(H, 8, 4, 2, init_std=0.3)
        self.head = paddle.nn.Linear(H, 1)

    def forward(self, x, labels=None):
        hidden, aux = self.moe(x)
        pred = self.head(hidden).squeeze(-1)
        if labels is None:
            return (pred,)
        return paddle.nn.functional.mse_loss(pred, labels) + aux, pred

    def extra_metrics(self):
        return moe_metrics({"moe": self.moe})


def test_the_window_pools_training_forwards_only_and_starts_again_when_read():
    paddle.seed(0)
    layer = MoELayer(H, 8, 4, 2)
    layer.train()
    layer(paddle.randn([5, H]))
    layer(paddle.randn([3, H]))
    layer.eval()
    layer(paddle.randn([7, H]))  # evaluation is not training load
    window = layer.take_window_stats()
    assert sum(window.tokens_per_expert) == (5 + 3) * 2
    assert layer.take_window_stats() is None


def test_the_trainer_logs_the_models_extra_metrics_at_each_logging_step(tmp_path):
    paddle.seed(1)
    rng = np.random.RandomState(0)
    data = [{"x": rng.randn(H).astype("float32"), "labels": np.float32(rng.randn())} for _ in range(32)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, logging_steps=2, per_device_train_batch_size=4,
                             save_strategy="no", report_to=[], device="cpu", seed=1)
    trainer = Trainer(model=MoERegression(), args=args, train_dataset=data)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 4]
    for entry in logged:
        assert entry["moe/max_imbalance"] >= 1.0 and entry["moe/moe/imbalance"] == entry["moe/max_imbalance"]
        assert entry["moe/aux_loss"] > 0


def test_mfu_counts_the_weights_a_token_goes_through_not_every_expert():
    from paddletrainer.metrics import flops_per_token_of_model

    layer = MoELayer(8, 6, 4, 2, shared_expert_intermediate_size=5)
    # router 8x4, two experts' SwiGLU 3x8x6 each, the shared expert 3x8x5
    assert layer.active_matmul_weights() == 8 * 4 + 2 * 3 * 8 * 6 + 3 * 8 * 5

    class Counted(paddle.nn.Layer):
        config = None

        def flops_per_token(self):
            return 1234

    assert flops_per_token_of_model(Counted()) == 1234  # the model's own count wins over its config's
