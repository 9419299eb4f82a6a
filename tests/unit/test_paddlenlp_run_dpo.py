"""PaddleNLP's own ``llm/alignment/dpo/run_dpo.py`` (with its ``dpo_argument.py``) run twice from a scratch
directory on one process — as PaddleNLP ships it, and with its imports of ``paddlenlp.trl``/``paddlenlp.trainer``
switched to ``paddletrainer`` — on the repository's tiny Llama tokenizer, a tiny random Llama and 12 preference
pairs: every logged step loss agrees to 1e-5. The reference is a LoRA policy (its base model) or none
(``reference_free``): PaddleNLP's script wraps a separate reference with ``fleet.distributed_model``, which needs
more than one process. Needs ``PADDLENLP_LLM_DIR`` (PaddleNLP's ``llm/``; see docs/paddlenlp_compat.md); skipped
without it.
"""
import json
import os
import shutil

import pytest
from paddlenlp_runs import ROOT, script_step_losses

LLM_DIR = os.environ.get("PADDLENLP_LLM_DIR", "")
SCRIPT_DIR = os.path.join(LLM_DIR, "alignment", "dpo")
NEEDS_SCRIPT = pytest.mark.skipif(not os.path.isfile(os.path.join(SCRIPT_DIR, "run_dpo.py")),
                                reason="PADDLENLP_LLM_DIR (PaddleNLP's llm/, with alignment/dpo/run_dpo.py) not set")
SWAPS = {"run_dpo.py": [("from paddlenlp.trainer import PdArgumentParser", "from paddletrainer import PdArgumentParser"),
                        ("from paddlenlp.trl import (", "from paddletrainer.trl import (")],
         "dpo_argument.py": [("from paddlenlp.trainer import TrainingArguments",
                              "from paddletrainer import TrainingArguments"),
                             ("from paddlenlp.trainer.trainer_utils", "from paddletrainer.trainer_utils"),
                             ("from paddlenlp.trainer.utils.doc", "from paddletrainer.utils.doc")]}


def script_copy(directory, swap: bool):
    os.makedirs(directory)
    for name, swaps in SWAPS.items():
        text = open(os.path.join(SCRIPT_DIR, name), encoding="utf-8").read()
        for old, new in swaps if swap else []:
            assert old in text, f"{name} no longer has {old!r}"
            text = text.replace(old, new)
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.join(directory, "run_dpo.py")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The tiny model (the Llama example's tokenizer and config, random weights) and the pairs."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    base = tmp_path_factory.mktemp("run_dpo")
    model_dir = base / "model"
    tokenizer_dir = os.path.join(ROOT, "llm_examples", "llama", "tiny_llama")
    shutil.copytree(tokenizer_dir, model_dir)
    paddle.seed(3)
    LlamaForCausalLM(LlamaConfig.from_pretrained(tokenizer_dir)).save_pretrained(str(model_dir))
    texts = ["这家店的菜很好吃", "服务太慢了", "环境不错，价格合理", "质量很差，不推荐", "快递很快，包装完好",
             "屏幕有划痕", "性价比很高", "客服态度冷淡", "味道一般", "下次还会再来", "电池不耐用", "物流给力"]
    with open(base / "train.jsonl", "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            pair = {"src": f"评论：{text}。情感是？", "tgt": [], "response": ["正面", "负面"][::1 - 2 * (i % 2)],
                    "sort": [1, 0]}
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    return base


def run(scratch, script, name, dpo_options):
    config = dict(model_name_or_path=str(scratch / "model"), train_dataset_path=str(scratch / "train.jsonl"),
                  dev_dataset_path=str(scratch / "train.jsonl"), output_dir=str(scratch / name), max_seq_len=64,
                  max_prompt_len=32, per_device_train_batch_size=2, max_steps=3, logging_steps=1, learning_rate=1e-3,
                  lr_scheduler_type="constant", seed=7, do_train=True, save_strategy="no", report_to="none",
                  disable_tqdm=True, device="cpu", unified_checkpoint=False, tensor_parallel_output=False,
                  **dpo_options)
    return script_step_losses(script, scratch / f"{name}.json", config)


def test_save_model_takes_paddlenlps_merge_tensor_parallel(tmp_path):
    # run_dpo.py/run_finetune.py end with trainer.save_model(merge_tensor_parallel=...)
    import inspect

    from paddlenlp.trainer import Trainer as PaddleNLPTrainer

    from paddletrainer import Trainer

    assert list(inspect.signature(Trainer.save_model).parameters) == list(
        inspect.signature(PaddleNLPTrainer.save_model).parameters)


@NEEDS_SCRIPT
@pytest.mark.parametrize("dpo_options", [dict(lora=True, lora_rank=4), dict(reference_free=True, loss_type="ipo")],
                         ids=["lora_reference", "reference_free_ipo"])
def test_paddlenlps_run_dpo_with_imports_swapped_logs_paddlenlps_losses(scratch, tmp_path, dpo_options):
    name = "_".join(f"{k}{v}" for k, v in dpo_options.items())
    theirs = run(scratch, script_copy(tmp_path / "theirs", swap=False), f"theirs_{name}", dpo_options)
    ours = run(scratch, script_copy(tmp_path / "ours", swap=True), f"ours_{name}", dpo_options)
    assert len(theirs) == 3, theirs
    assert ours == pytest.approx(theirs, rel=1e-5)
