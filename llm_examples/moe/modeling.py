"""A small MoE Llama: PaddleNLP's Llama whose MLP is paddletrainer's ``MoELayer`` in every
``moe_layer_interval``-th decoder layer (the last of each interval: layers 1, 3, ... for an interval of 2).

Config keys read on top of Llama's (config.json): ``num_experts``, ``num_experts_per_tok`` (top-k),
``moe_intermediate_size``, ``shared_expert_intermediate_size`` (0 = none), ``moe_layer_interval``,
``norm_topk_prob``, ``router_aux_loss_coef``, ``router_z_loss_coef``.

The training loss is the LM loss plus every MoE layer's auxiliary term (already weighted by its
coefficient); the evaluation loss is the LM loss alone. The expert
groups come from the caller (``expert_group``/``token_group``): the model never looks them up itself.
"""
from __future__ import annotations

from paddlenlp.transformers import LlamaForCausalLM

from paddletrainer.moe import MoELayer
from paddletrainer.metrics.throughput import flops_per_token_from_config
from paddletrainer.moe.stats import moe_metrics

MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "moe_layer_interval", "norm_topk_prob", "router_aux_loss_coef", "router_z_loss_coef")


class MoEMLP(MoELayer):
    """``MoELayer`` with the Llama MLP's call signature: returns the output only and keeps the auxiliary term
    of this forward in ``aux_loss`` for the model's loss."""

    def forward(self, hidden_states):
        out, self.aux_loss = super().forward(hidden_states)
        return out


def check_moe_config(config) -> None:
    """Every MoE key present and sensible, one line naming the key otherwise."""
    missing = [key for key in MOE_KEYS if not hasattr(config, key)]
    if missing:
        raise ValueError(f"MoE config: {', '.join(missing)} missing from config.json (see llm_examples/moe/tiny_moe)")
    if not 1 <= config.moe_layer_interval <= config.num_hidden_layers:
        raise ValueError(f"MoE config: moe_layer_interval must be in [1, num_hidden_layers="
                         f"{config.num_hidden_layers}], got {config.moe_layer_interval}")


class MoELlamaForCausalLM(LlamaForCausalLM):
    """Llama causal LM with MoE MLPs (see module). ``expert_group``/``token_group``: see ``MoELayer``."""

    def __init__(self, config, expert_group=None, token_group=None):
        super().__init__(config)
        check_moe_config(config)
        for index, layer in enumerate(self.llama.layers):
            if (index + 1) % config.moe_layer_interval == 0:
                layer.mlp = MoEMLP(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                                   config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob,
                                   aux_loss_coef=config.router_aux_loss_coef, z_loss_coef=config.router_z_loss_coef,
                                   shared_expert_intermediate_size=config.shared_expert_intermediate_size,
                                   expert_group=expert_group, token_group=token_group,
                                   init_std=config.initializer_range)

    def _init_weights(self, layer):
        # Experts keep MoELayer's own initialisation (per global index: the same in every layout); Llama's would
        # draw from Paddle's RNG once per *local* expert and shift every draw after it by the layout.
        if any(getattr(p, "is_expert", False) for p in layer.parameters(include_sublayers=False)):
            return
        super()._init_weights(layer)

    def moe_layers(self) -> dict:
        """``{"layers.<i>.mlp": MoEMLP}``."""
        return {f"layers.{i}.mlp": layer.mlp for i, layer in enumerate(self.llama.layers)
                if isinstance(layer.mlp, MoEMLP)}

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if labels is None or not self.training:  # evaluation reports the LM loss alone
            return outputs
        aux = sum(layer.aux_loss for layer in self.moe_layers().values())
        if isinstance(outputs, tuple):
            return (outputs[0] + aux,) + outputs[1:]
        outputs["loss"] = outputs["loss"] + aux
        return outputs

    def flops_per_token(self) -> int:
        """Training FLOPs per token for the Trainer's MFU: Llama's count with each MoE layer's dense MLP replaced by
        the weights a token goes through (router, top-k experts, shared expert): 6 FLOPs per weight."""
        config, moe = self.config, self.moe_layers().values()
        dense_mlp = 3 * config.hidden_size * config.intermediate_size
        return flops_per_token_from_config(config) + 6 * sum(m.active_matmul_weights() - dense_mlp for m in moe)

    def extra_metrics(self) -> dict:
        """Expert load since the last call (the Trainer logs it with the loss): see ``moe_metrics``."""
        return moe_metrics(self.moe_layers())
