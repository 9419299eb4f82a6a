"""``paddletrainer.trl`` against ``paddlenlp.trl`` on one process: the same tiny PaddleNLP Llama, the same
preference pairs (packed several to a row by PaddleNLP's zero-padding stream) or SFT texts, the same options;
every logged loss and DPO metric agrees to 1e-5. Also: our pair preprocessing builds PaddleNLP's rows exactly,
and an optimizer step's DPO loss is the mean over the pairs of its global batch whatever the micro-batching.
"""
import numpy as np
import paddle
import pytest

paddlenlp_trl = pytest.importorskip("paddlenlp.trl")
from paddlenlp.datasets import MapDataset, ZeroPaddingMapDataset  # noqa: E402

from paddletrainer import TrainingArguments  # noqa: E402
from paddletrainer.trl import (DPOConfig, DPOTrainer, SFTConfig, SFTTrainer, preference_collate_fn,  # noqa: E402
                               preprocess_preference_data)

VOCAB, MAX_LEN, STEPS = 96, 48, 3
METRICS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]


class SFTHistory:
    """PaddleNLP's SFTTrainer, its logs kept (its Trainer empties state.log_history at each log)."""

    def log(self, logs, **kwargs):
        super().log(logs, **kwargs)
        self.state.kept_history = getattr(self.state, "kept_history", []) + [dict(logs)]


class CharTokenizer:
    """One id per character (3..95); 1 is eos, 0 pad; enough of PaddleNLP's tokenizer interface for both sides."""

    chat_template = None
    eos_token_id, pad_token_id, bos_token_id = 1, 0, 2
    eos_token, pad_token, padding_side, model_max_length = "</s>", "<pad>", "right", MAX_LEN

    def encode(self, text, add_special_tokens=True):
        return {"input_ids": [3 + ord(c) % (VOCAB - 3) for c in text]}

    def __call__(self, texts, add_special_tokens=True, truncation=True, max_length=None, **_):
        ids = [self.encode(t)["input_ids"][:max_length] for t in texts]
        return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}

    def pad(self, features, max_length=None, pad_to_multiple_of=None, return_tensors="np", **_):
        """Right-pad every key to the longest (PaddleNLP's collator pads ``labels`` itself first)."""
        width = max(len(f["input_ids"]) for f in features)
        return {key: np.array([list(f[key]) + [0] * (width - len(f[key])) for f in features], dtype="int64")
                for key in features[0]}


class Options:
    max_seq_len, max_prompt_len, flash_mask = MAX_LEN, 24, False


def tiny_llama(seed=2024):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=MAX_LEN,
                         seq_length=MAX_LEN, rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                         tie_word_embeddings=False, dtype="float32")
    paddle.seed(seed)
    return LlamaForCausalLM(config)


def raw_pairs(n, seed=0):
    rng = np.random.RandomState(seed)
    words = lambda k: "".join(chr(97 + c) for c in rng.randint(0, 26, size=k))  # noqa: E731
    return [{"src": words(rng.randint(3, 16)), "tgt": [], "response": [words(rng.randint(2, 12)), words(rng.randint(2, 12))],
             "sort": [int(s) for s in rng.permutation(2)]} for _ in range(n)]


def packed_rows(preprocess, n=8 * STEPS):
    rows = [preprocess(dict(p, response=list(p["response"]), sort=list(p["sort"])), CharTokenizer(), Options(), Options())
            for p in raw_pairs(n)]
    return ZeroPaddingMapDataset(MapDataset(rows), tokenizer=CharTokenizer(), max_length=MAX_LEN)


def test_our_preference_rows_are_paddlenlps():
    ours, theirs = packed_rows(preprocess_preference_data), packed_rows(paddlenlp_trl.preprocess_preference_data)
    assert len(ours) == len(theirs) and len(ours) < 8 * STEPS  # several pairs share a row
    for a, b in zip(ours, theirs):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)
    batch = [theirs[0], theirs[1]]
    for key, value in preference_collate_fn(batch, MAX_LEN).items():
        np.testing.assert_array_equal(value, paddlenlp_trl.preference_collate_fn(batch, MAX_LEN)[key], err_msg=key)


class PaddleNLPDPOTrainer(paddlenlp_trl.DPOTrainer):
    """PaddleNLP's, except that the reference is not passed to ``fleet.distributed_model`` (which needs
    ``fleet.init``; on one process that wrapper adds nothing to the forward)."""

    def _wrap_ref_model(self, model):
        return model

    def log(self, logs, **kwargs):  # PaddleNLP's Trainer empties state.log_history at each log: keep them
        super().log(logs, **kwargs)
        self.state.kept_history = getattr(self.state, "kept_history", []) + [dict(logs)]


def _dpo_args(cls, tmp_path, batch, accumulation):
    return cls(output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=batch,
               gradient_accumulation_steps=accumulation, learning_rate=0.01, lr_scheduler_type="constant",
               logging_steps=1, save_steps=100, seed=7, disable_tqdm=True, report_to="none", max_grad_norm=1.0)


def lora_llama():
    from paddlenlp.peft import LoRAConfig, LoRAModel

    model = tiny_llama()
    paddle.seed(11)
    return LoRAModel(model, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8))


def run_dpo(trainer_cls, args, dpo_config, rows):
    model = lora_llama() if dpo_config.lora else tiny_llama()
    ref_model = None if dpo_config.reference_free or dpo_config.lora else tiny_llama()
    trainer = trainer_cls(model=model, ref_model=ref_model, dpo_config=dpo_config, args=args, train_dataset=rows,
                          data_collator=lambda b: preference_collate_fn(b, MAX_LEN), ignore_eos_token=True)
    trainer.train()
    history = getattr(trainer.state, "kept_history", trainer.state.log_history)
    return [{k: h[k] for k in h if k in METRICS or k.endswith("_loss")} for h in history if "loss" in h]


@pytest.mark.parametrize("options", [dict(), dict(loss_type="ipo", beta=0.5), dict(label_smoothing=0.2, beta=0.3),
                                     dict(loss_type="hinge", reference_free=True, sft_loss_ratio=0.5),
                                     dict(lora=True, beta=0.5)],
                         ids=["sigmoid", "ipo", "label_smoothing", "hinge_reference_free_sft", "lora_reference"])
def test_dpo_trainer_logs_paddlenlps_losses_and_rewards(tmp_path, options):
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArgs

    rows = packed_rows(preprocess_preference_data)
    batch = 2
    theirs = run_dpo(PaddleNLPDPOTrainer, _dpo_args(PaddleNLPArgs, tmp_path / "theirs", batch, 1),
                     DPOConfig(**options), rows)
    ours = run_dpo(DPOTrainer, _dpo_args(TrainingArguments, tmp_path / "ours", batch, 1), DPOConfig(**options), rows)
    assert len(ours) == len(theirs) == STEPS
    for mine, reference in zip(ours, theirs):
        assert sorted(mine) == sorted(reference)
        for key in reference:
            assert mine[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), key


def test_a_dpo_step_is_the_mean_over_the_pairs_of_its_global_batch(tmp_path):
    rows = packed_rows(preprocess_preference_data)
    pairs = [len(rows[i]["response_indexs"]) for i in range(4)]
    assert len(set(pairs)) > 1, pairs  # rows hold different numbers of pairs, else this proves nothing
    whole = run_dpo(DPOTrainer, _dpo_args(TrainingArguments, tmp_path / "one", 4, 1), DPOConfig(), rows)
    split = run_dpo(DPOTrainer, _dpo_args(TrainingArguments, tmp_path / "ga", 1, 4), DPOConfig(), rows)
    for a, b in zip(whole, split):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


def _sft_texts():
    from datasets import Dataset

    rng = np.random.RandomState(3)
    return Dataset.from_dict({"text": ["".join(chr(97 + c) for c in rng.randint(0, 26, size=rng.randint(5, 30)))
                                       for _ in range(24)]})


def test_sft_trainer_logs_paddlenlps_losses(tmp_path):
    from paddlenlp.trl import SFTConfig as PaddleNLPSFTConfig

    def run(trainer_cls, config_cls, name, **options):
        args = config_cls(**options, output_dir=str(tmp_path / name), max_steps=STEPS, per_device_train_batch_size=4,
                          learning_rate=0.01, lr_scheduler_type="constant", logging_steps=1, save_steps=100, seed=7,
                          disable_tqdm=True, report_to="none", max_seq_length=MAX_LEN, max_grad_norm=1.0,
                          per_device_eval_batch_size=4)
        trainer = trainer_cls(model=tiny_llama(), args=args, train_dataset=_sft_texts(), eval_dataset=_sft_texts(),
                              tokenizer=CharTokenizer())
        trainer.train()
        history = getattr(trainer.state, "kept_history", trainer.state.log_history)
        logs = [(h["loss"], h["ppl"]) for h in history if "loss" in h]
        return logs, trainer.evaluate()["eval_loss"]

    # eval_loss: PaddleNLP's mean of the eval batches' means (our default is the token mean of the whole set)
    ours, theirs = run(SFTTrainer, SFTConfig, "ours", loss_average="micro_batch"), run(type("PaddleNLPSFTTrainer", (SFTHistory, paddlenlp_trl.SFTTrainer), {}),
                                                           PaddleNLPSFTConfig, "theirs")
    assert len(ours[0]) == STEPS
    assert np.asarray(ours[0]).ravel() == pytest.approx(np.asarray(theirs[0]).ravel(), rel=1e-5)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-5)
