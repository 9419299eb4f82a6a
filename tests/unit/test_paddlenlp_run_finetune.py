"""PaddleNLP's own ``llm/run_finetune.py`` (with the ``utils/argument.py`` and ``utils/data.py`` beside it) run
twice from a scratch directory on one process — as PaddleNLP ships it, and with its imports of
``paddlenlp.trainer``/``paddlenlp.trl`` switched to ``paddletrainer`` — on the repository's tiny Llama tokenizer, a
tiny random Llama and 12 instruction pairs: full fine-tuning (with weight decay, which PaddleNLP applies to every
parameter the script hands ``set_optimizer_grouped_parameters``), LoRA, zero padding and greedy zero padding
(several pairs packed in one row). Every logged step loss agrees to 1e-5. Needs ``PADDLENLP_LLM_DIR``
(PaddleNLP's ``llm/``; see docs/paddlenlp_compat.md); skipped without it.
"""
import json
import os
import shutil

import pytest
from paddlenlp_runs import ROOT, script_step_losses

LLM_DIR = os.environ.get("PADDLENLP_LLM_DIR", "")
NEEDS_SCRIPT = pytest.mark.skipif(not os.path.isfile(os.path.join(LLM_DIR, "run_finetune.py")),
                                reason="PADDLENLP_LLM_DIR (PaddleNLP's llm/, with run_finetune.py) not set")
SWAPS = [("from paddlenlp.trainer import PdArgumentParser", "from paddletrainer import PdArgumentParser"),
         ("from paddlenlp.trainer.trainer_callback import", "from paddletrainer.trainer_callback import"),
         ("from paddlenlp.trl import DataConfig", "from paddletrainer.trl import DataConfig")]
# Rows of packed pairs are few: one row per batch keeps every batch full (PaddleNLP trains an epoch's short last
# batch as it is; ours fills it from the epoch's start, so a short batch would differ by design).
CASES = {"sft": dict(weight_decay=0.1), "lora": dict(lora=True, lora_rank=4),
         "zero_padding": dict(zero_padding=True, per_device_train_batch_size=1),
         "greedy_zero_padding": dict(zero_padding=True, greedy_zero_padding=True, per_device_train_batch_size=1)}


def script_copy(directory, swap: bool):
    """run_finetune.py and its utils/ in ``directory``, the Trainer imports switched to ours with ``swap``."""
    shutil.copytree(os.path.join(LLM_DIR, "utils"), os.path.join(directory, "utils"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = open(os.path.join(LLM_DIR, "run_finetune.py"), encoding="utf-8").read()
    for old, new in SWAPS if swap else []:
        assert old in text, f"run_finetune.py no longer has {old!r}"
        text = text.replace(old, new)
    with open(os.path.join(directory, "run_finetune.py"), "w", encoding="utf-8") as f:
        f.write(text)
    return os.path.join(directory, "run_finetune.py")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The tiny model (the Llama example's tokenizer and config, random weights) and the pairs (src/tgt)."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    base = tmp_path_factory.mktemp("run_finetune")
    tokenizer_dir = os.path.join(ROOT, "llm_examples", "llama", "tiny_llama")
    shutil.copytree(tokenizer_dir, base / "model")
    paddle.seed(3)
    LlamaForCausalLM(LlamaConfig.from_pretrained(tokenizer_dir)).save_pretrained(str(base / "model"))
    reviews = ["这家店的菜很好吃", "服务太慢了", "环境不错，价格合理", "质量很差，不推荐", "快递很快，包装完好",
               "屏幕有划痕", "性价比很高", "客服态度冷淡", "味道一般", "下次还会再来", "电池不耐用", "物流给力"]
    (base / "data").mkdir()
    with open(base / "data" / "train.json", "w", encoding="utf-8") as f:
        for i, review in enumerate(reviews):
            pair = {"src": f"评论：{review}。情感是？", "tgt": ["正面", "负面"][i % 2] + "。" * (i % 3)}
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    return base


def step_losses(scratch, script, name, options):
    config = dict(model_name_or_path=str(scratch / "model"), dataset_name_or_path=str(scratch / "data"),
                  output_dir=str(scratch / name), max_length=160, src_length=64, per_device_train_batch_size=2,
                  max_steps=3, logging_steps=1, learning_rate=1e-3, lr_scheduler_type="constant", seed=7,
                  do_train=True, save_strategy="no", report_to="none", disable_tqdm=True, device="cpu",
                  unified_checkpoint=False, tensor_parallel_output=False, overwrite_output_dir=True)
    config.update(options)
    return script_step_losses(script, scratch / f"{name}.json", config)


@NEEDS_SCRIPT
@pytest.mark.parametrize("case", list(CASES))
def test_paddlenlps_run_finetune_with_imports_swapped_logs_paddlenlps_losses(scratch, tmp_path, case):
    theirs = step_losses(scratch, script_copy(tmp_path / "theirs", swap=False), f"theirs_{case}", CASES[case])
    ours = step_losses(scratch, script_copy(tmp_path / "ours", swap=True), f"ours_{case}", CASES[case])
    assert len(theirs) == 3, theirs
    assert ours == pytest.approx(theirs, rel=1e-5)
