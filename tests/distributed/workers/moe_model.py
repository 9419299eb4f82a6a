"""A tiny token model around ``paddletrainer.moe.MoELayer`` for the expert-parallel Trainer tests: embedding →
MoE MLP (residual) → lm head, loss = mean token cross entropy + the layer's auxiliary term.

The layer takes its groups from ``paddletrainer.parallel.expert`` (the MoE contract), so the topology is built
first (``init_topology`` is idempotent: the Trainer gets the same one)."""
from __future__ import annotations

import types

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear

from common import VOCAB
from paddletrainer.moe import MoELayer
import paddletrainer.parallel.expert as expert
from paddletrainer.parallel import init_topology

HIDDEN, NUM_EXPERTS = 16, 4


class TinyMoE(paddle.nn.Layer):
    """Under tensor parallel (``tp`` > 1) the lm head is a ``ColumnParallelLinear`` (gathered output) holding this
    tp rank's columns of the same full weight one process draws."""

    def __init__(self, expert_group=None, token_group=None, tp=1, tp_rank=0):
        super().__init__()
        self.config = types.SimpleNamespace(num_experts=NUM_EXPERTS)
        self.embed = paddle.nn.Embedding(VOCAB, HIDDEN)
        self.mlp = MoELayer(HIDDEN, 16, NUM_EXPERTS, top_k=2, aux_loss_coef=0.01, z_loss_coef=0.001,
                            expert_group=expert_group, token_group=token_group)
        weight = np.random.default_rng(5).normal(0.0, 0.05, (HIDDEN, VOCAB)).astype("float32")
        if tp > 1:
            self.head = ColumnParallelLinear(HIDDEN, VOCAB, has_bias=True, gather_output=True)
            cols = VOCAB // tp
            weight = weight[:, tp_rank * cols:(tp_rank + 1) * cols]
        else:
            self.head = paddle.nn.Linear(HIDDEN, VOCAB)
        self.head.weight.set_value(paddle.to_tensor(weight))
        self.head.bias.set_value(paddle.zeros_like(self.head.bias))

    def forward(self, input_ids, labels=None):
        h = self.embed(input_ids)
        out, aux = self.mlp(h)
        logits = self.head(h + out)
        if labels is None:
            return (logits,)
        loss = F.cross_entropy(logits.reshape([-1, VOCAB]), labels.reshape([-1])).mean()
        # the auxiliary term depends on the batch's composition: trained on, left out of the eval loss so that
        # it is the mean over samples whatever the eval batch
        return (loss + aux if self.training else loss), logits


def build_moe_model(args):
    """The model for ``args``' layout (the groups of its expert parallel), same initial weights on every layout."""
    topology = init_topology(args.parallel_config)
    paddle.seed(1234)
    return TinyMoE(expert.expert_parallel_group(), expert.token_group(), topology.tp_degree, topology.tp_rank)
