"""A tiny token model around ``paddletrainer.moe.MoELayer`` for the expert-parallel Trainer tests: embedding →
MoE MLP (residual) → lm head, loss = mean token cross entropy + the layer's auxiliary term.

Under pipeline parallel (``TinyMoEPipe``) the same layers are cut in two stages: embedding → MoE MLP on the
first; the second MoE block (``moe_layers=2``), lm head and loss on the second. The auxiliary term travels with
the hidden states as a second activation (each stage adds its own), so the last stage adds the sum to the loss
and its gradient (1 / micro-batches) flows back to every stage's router.

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
    tp rank's columns of the same full weight one process draws. ``moe_layers=2`` adds a second MoE block
    (``mlp2``, its auxiliary term added to the first's) before the head."""

    def __init__(self, expert_group=None, token_group=None, tp=1, tp_rank=0, moe_layers=1):
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
        self.mlp2 = None
        if moe_layers == 2:  # created last: the one-layer model's weights stay as they were
            self.mlp2 = MoELayer(HIDDEN, 16, NUM_EXPERTS, top_k=2, aux_loss_coef=0.01, z_loss_coef=0.001,
                                 expert_group=expert_group, token_group=token_group)

    def forward(self, input_ids, labels=None):
        h = self.embed(input_ids)
        out, aux = self.mlp(h)
        h = h + out
        if self.mlp2 is not None:
            out, aux2 = self.mlp2(h)
            h, aux = h + out, aux + aux2
        logits = self.head(h)
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
    """Last stage: ``TinyMoE``'s second MoE block (when it has one), its auxiliary term added to the one received,
    and the lm head; in training also passes the auxiliary term on to the loss."""

    def __init__(self, full):
        super().__init__()
        self.mlp2, self.head = full.mlp2, full.head

    def forward(self, args):
        hidden, aux = args
        if self.mlp2 is not None:
            out, aux2 = self.mlp2(hidden)
            hidden, aux = hidden + out, aux + aux2.reshape([1])
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


def build_moe_model(args, moe_layers=1):
    """The model for ``args``' layout (the groups of its expert parallel), same initial weights on every layout."""
    topology = init_topology(args.parallel_config)
    paddle.seed(1234)
    full = TinyMoE(expert.expert_parallel_group(), expert.token_group(), topology.tp_degree, topology.tp_rank,
                   moe_layers)
    return TinyMoEPipe(full, topology.pp_degree) if topology.pp_degree > 1 else full
