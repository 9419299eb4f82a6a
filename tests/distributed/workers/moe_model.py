"""A tiny token model around ``paddletrainer.moe.MoELayer`` for the expert-parallel Trainer tests: embedding →
MoE MLP (residual) → lm head, loss = mean token cross entropy + the layer's auxiliary term.

Under pipeline parallel (``TinyMoEPipe``) the same layers are cut in two stages: embedding → MoE MLP on the
first, lm head and loss on the second; the MoE layer's auxiliary term travels with the hidden states as a second
activation, so the last stage adds it to the loss and its gradient (1 / micro-batches) flows back to the router.

The layer takes its groups from ``paddletrainer.parallel.expert`` (the MoE contract), so the topology is built
first (``init_topology`` is idempotent: the Trainer gets the same one)."""
from __future__ import annotations

import types

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear, LayerDesc, PipelineLayer

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


class _EmbedMoE(paddle.nn.Layer):
    """First stage: ``TinyMoE``'s embedding and MoE block; outputs the residual stream and the auxiliary term."""

    def __init__(self, full):
        super().__init__()
        self.embed, self.mlp = full.embed, full.mlp

    def forward(self, input_ids):
        h = self.embed(input_ids)
        out, aux = self.mlp(h)
        return h + out, aux.reshape([1])  # p2p sends tensors with at least one dimension


class _Head(paddle.nn.Layer):
    """Last stage: ``TinyMoE``'s lm head; in training also passes the auxiliary term on to the loss."""

    def __init__(self, full):
        super().__init__()
        self.head = full.head

    def forward(self, args):
        hidden, aux = args
        logits = self.head(hidden)
        return (logits, aux) if self.training else logits


class _PipeLoss:
    """Mean token cross entropy, plus the auxiliary term in training (as ``TinyMoE``)."""

    def __call__(self, output, labels):
        logits, aux = output if isinstance(output, (tuple, list)) else (output, None)
        loss = F.cross_entropy(logits.reshape([-1, VOCAB]), labels.reshape([-1])).mean()
        return loss if aux is None else loss + aux.reshape([])


class TinyMoEPipe(PipelineLayer):
    """``TinyMoE`` in two pipeline stages, its parameters those of a ``TinyMoE`` built the same way."""

    def __init__(self, full, num_stages):
        super().__init__(layers=[LayerDesc(_EmbedMoE, full), LayerDesc(_Head, full)], num_stages=num_stages,
                         loss_fn=_PipeLoss())
        self.config = full.config

    def _prepare_pipeline_inputs_func(self, batch):
        return batch["input_ids"], batch.get("labels")  # predict() batches carry no labels


def build_moe_model(args):
    """The model for ``args``' layout (the groups of its expert parallel), same initial weights on every layout."""
    topology = init_topology(args.parallel_config)
    paddle.seed(1234)
    full = TinyMoE(expert.expert_parallel_group(), expert.token_group(), topology.tp_degree, topology.tp_rank)
    return TinyMoEPipe(full, topology.pp_degree) if topology.pp_degree > 1 else full
