"""The tensor-parallel refusals of ``check_model_for_layout`` name what the user can actually change: a model
family that builds tensor-parallel layers (Llama) built with another degree is told to set its config; one that
has none (ERNIE, whose ``from_pretrained`` raises on a config with tensor_parallel_degree > 1) is told so."""
import pytest
from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification, LlamaConfig, LlamaForCausalLM

from paddletrainer.checks import check_model_for_layout
from paddletrainer.training_args import ParallelDegrees


def one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text, text
    return text


def test_check_model_for_layout_refuses_a_config_built_for_another_tp_degree():
    model = LlamaForCausalLM(tiny_llama_config(tensor_parallel_degree=1))  # Llama builds tp layers from its config
    with pytest.raises(ValueError) as info:
        check_model_for_layout(model, ParallelDegrees(world_size=2, dp=1, sharding=1, tp=2, pp=1))
    assert "tensor_parallel_degree=2 but LlamaForCausalLM.config.tensor_parallel_degree=1" in one_line(info)


def test_tensor_parallel_refusal_of_ernie_says_it_has_no_tp_layers_not_to_set_its_config():
    # setting ERNIE's config.tensor_parallel_degree would only make PaddleNLP's from_pretrained raise
    config = ErnieConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=16, type_vocab_size=2)
    for config_tp in (1, 2):
        config.tensor_parallel_degree = config_tp
        with pytest.raises(ValueError) as info:
            check_model_for_layout(ErnieForSequenceClassification(config),
                                   ParallelDegrees(world_size=2, dp=1, sharding=1, tp=2, pp=1))
        text = one_line(info)
        assert "ErnieForSequenceClassification has no tensor-parallel layers" in text, text
        assert "tensor_parallel_degree=1" in text and "set config.tensor_parallel_degree = " not in text, text


def tiny_llama_config(**options):
    return LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                       max_position_embeddings=16, **options)
