"""The tiny regression model and data the single-process Trainer tests share."""
import numpy as np
import paddle


class RegressionModel(paddle.nn.Layer):
    """y = a·x + b; returns (loss, prediction) with labels, (prediction,) without."""

    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        if labels is None:
            return (pred,)
        return paddle.nn.functional.mse_loss(pred, labels), pred


def regression_data(n=64, a=2.0, b=-1.0, seed=0):
    """``n`` samples ``{"x": [x], "labels": a·x + b}`` with x uniform in [-1, 1)."""
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(n, 1)).astype("float32")
    return [{"x": x[i], "labels": np.float32(a * x[i, 0] + b)} for i in range(n)]
