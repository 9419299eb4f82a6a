"""PaddleNLP's ``llm/run_finetune.py`` parses ``(GenerateArgument, ModelConfig, ReftArgument, DataConfig,
SFTConfig)`` and then hands the Trainer only the parameters it trains. Ours must parse the same options with the
same defaults (``SFTConfig`` carries the ``llmmetaclass`` options, PaddleNLP 3.0.0b4's ``sft_config.py``) and
train those parameters as PaddleNLP's Trainer does (``set_optimizer_grouped_parameters``)."""
import dataclasses
import json
import sys

import numpy as np
import paddle
import pytest

from paddletrainer import PdArgumentParser, Trainer, TrainingArguments
from paddletrainer.trl import DataConfig, ModelConfig, SFTConfig

paddlenlp_trl = pytest.importorskip("paddlenlp.trl")
paddlenlp_trainer = pytest.importorskip("paddlenlp.trainer")
configuration_utils = pytest.importorskip("paddlenlp.transformers.configuration_utils")
LLM_META_NAMES = [name for name, *_ in configuration_utils.LlmMetaConfig._get_all_meta()]


def parsed_defaults(cls):
    (args,) = PdArgumentParser(cls).parse_dict({})
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}


def test_sft_config_has_paddlenlps_llm_meta_options_with_their_defaults(tmp_path):
    ours, theirs = SFTConfig(output_dir=str(tmp_path)), paddlenlp_trl.SFTConfig(output_dir=str(tmp_path))
    for name in LLM_META_NAMES:
        assert hasattr(ours, name) == hasattr(theirs, name), name
        if name in {f.name for f in dataclasses.fields(paddlenlp_trl.SFTConfig)}:
            assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.virtual_pp_degree == 1 and ours.recompute_granularity == "full"
    assert ours.tensor_parallel_output is False  # SFTConfig's own field wins over the llmmetaclass default (True)


def test_sft_config_parses_a_run_finetune_config_setting_the_llm_meta_options(tmp_path, monkeypatch):
    config = {"output_dir": str(tmp_path / "out"), "virtual_pp_degree": 1, "use_flash_attention": True,
              "recompute_granularity": "core_attn", "no_recompute_layers": [0, 2], "pp_recompute_interval": 2,
              "offload_recompute_inputs": True, "use_fused_rms_norm": True, "max_seq_length": 512}
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(config))
    monkeypatch.setattr(sys, "argv", ["run_finetune.py", str(path)])
    (ours,) = PdArgumentParser(SFTConfig).parse_json_file_and_cmd_lines()
    (theirs,) = paddlenlp_trainer.PdArgumentParser(paddlenlp_trl.SFTConfig).parse_json_file_and_cmd_lines()
    for name, value in config.items():
        assert getattr(ours, name) == getattr(theirs, name) == value, name


@pytest.mark.parametrize("name", ["ModelConfig", "DataConfig"])
def test_run_finetunes_model_and_data_configs_have_paddlenlps_fields_and_defaults(name):
    ours, theirs = {"ModelConfig": ModelConfig, "DataConfig": DataConfig}[name], getattr(paddlenlp_trl, name)
    assert parsed_defaults(ours) == parsed_defaults(theirs)


class TinyNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.head = paddle.nn.Linear(8, 8), paddle.nn.LayerNorm(8), paddle.nn.Linear(8, 1)

    def forward(self, x, labels):
        return (((self.head(self.norm(self.proj(x))) - labels) ** 2).mean(),)


def trained_parameters(trainer_cls, args_cls, tmp_path):
    paddle.seed(5)
    model = TinyNet()
    rng = np.random.RandomState(0)
    data = [{"x": rng.randn(8).astype("float32"), "labels": rng.randn(1).astype("float32")} for _ in range(8)]
    args = args_cls(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, learning_rate=0.1,
                    weight_decay=0.5, lr_scheduler_type="constant", save_strategy="no", report_to=[], device="cpu",
                    disable_tqdm=True, seed=5)
    sequential = lambda self: paddle.io.BatchSampler(self.train_dataset, batch_size=4, shuffle=False)  # noqa: E731
    trainer = type("Sequential", (trainer_cls,), {"_get_train_sampler": sequential})(
        model=model, args=args, train_dataset=data)
    trainer.set_optimizer_grouped_parameters([model.proj.weight, model.norm.weight, model.norm.bias])
    trainer.train()
    return {name: p.numpy() for name, p in model.named_parameters()}


def test_set_optimizer_grouped_parameters_trains_those_decaying_every_one_as_paddlenlp(tmp_path):
    ours = trained_parameters(Trainer, TrainingArguments, tmp_path / "ours")
    theirs = trained_parameters(paddlenlp_trainer.Trainer, paddlenlp_trainer.TrainingArguments, tmp_path / "theirs")
    paddle.seed(5)
    initial = {name: p.numpy() for name, p in TinyNet().named_parameters()}
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert np.array_equal(ours["head.weight"], initial["head.weight"])  # not in the groups: never stepped
    assert not np.array_equal(ours["norm.weight"], initial["norm.weight"])


def test_an_empty_parameter_list_is_refused_by_name(tmp_path):
    paddle.seed(5)
    trainer = Trainer(model=TinyNet(), args=TrainingArguments(output_dir=str(tmp_path), device="cpu", report_to=[]))
    trainer.set_optimizer_grouped_parameters([])
    with pytest.raises(ValueError, match="set_optimizer_grouped_parameters"):
        trainer.create_optimizer()
