"""DPO setups PaddleNLP refuses, and the layouts ``DPOTrainer`` does not run, end in one clear error before any
process group exists; a criterion that would need fused heads is refused by name."""
from types import SimpleNamespace

import pytest

from paddletrainer.parallel.layout import Layout

from paddletrainer.trl import DPOConfig, DPOCriterion
from paddletrainer.trl.dpo_trainer import check_dpo_setup

ONE_PROCESS = Layout(world_size=1)


@pytest.mark.parametrize("config,ref_model,message", [
    (None, None, "needs dpo_config"),
    (DPOConfig(loss_type="sigmod"), object(), "loss_type='sigmod' is unknown; valid: sigmoid, hinge"),
    (DPOConfig(reference_free=True), object(), "reference_free=True takes no ref_model"),
    (DPOConfig(reference_free=True, loss_type="dpop"), None, "needs a reference; reference_free works with"),
    (DPOConfig(loss_type="simpo"), object(), "takes no ref_model: set reference_free=True"),
    (DPOConfig(), None, "needs ref_model, or DPOConfig.reference_free=True, or DPOConfig.lora=True"),
])
def test_a_dpo_setup_paddlenlp_refuses_is_refused_with_the_option_named(config, ref_model, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_dpo_setup(config, ref_model, ONE_PROCESS)


@pytest.mark.parametrize("layout,model_with_dpo_criterion,message", [
    (Layout(world_size=2, cp=2), False, "DPOTrainer does not run with context_parallel_degree > 1"),
    (Layout(world_size=4, pp=2, sep=2), False,
     "DPOTrainer does not run with pipeline_parallel_degree > 1 and sep_parallel_degree > 1 together"),
    (Layout(world_size=2, sep=2), True, "model_with_dpo_criterion=True does not run with sep_parallel_degree > 1"),
])
def test_dpo_on_an_unsupported_layout_is_refused_naming_its_options(layout, model_with_dpo_criterion, message):
    with pytest.raises(ValueError, match=message):
        check_dpo_setup(DPOConfig(), object(), layout, model_with_dpo_criterion)


def test_the_model_computing_its_dpo_criterion_runs_without_sep():
    check_dpo_setup(DPOConfig(), object(), Layout(world_size=2, pp=2), model_with_dpo_criterion=True)


def test_a_fused_head_config_is_refused_by_the_criterion():
    config = SimpleNamespace(use_fused_head_and_loss_fn=True, tensor_parallel_output=False, tensor_parallel_degree=1)
    with pytest.raises(ValueError, match="set the model config's use_fused_head_and_loss_fn=False"):
        DPOCriterion(config, dpo_config=DPOConfig())
