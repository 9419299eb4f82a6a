"""A Trainer's ``checkpoint-N`` with whole weights is itself a PaddleNLP weights directory: ``from_pretrained``
loads it (through ``model.safetensors.index.json`` pointing at our shard files), and checkpoints written before
format version 2 (model tensors stored as ``model/<name>`` inside the shard) still resume."""
import json
import os
import shutil
import zlib

import numpy as np
import paddle
import pytest
from safetensors import safe_open

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint import read_index
from paddletrainer.checkpoint.write import write_safetensors

VOCAB = 96


def tiny_llama():
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(7)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32))


class TokenData(paddle.io.Dataset):
    def __init__(self, n=32, seq=12):
        rng = np.random.RandomState(0)
        self.rows = rng.randint(1, VOCAB, size=(n, seq)).astype("int64")

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def train(out, max_steps, save_steps, resume=None):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, learning_rate=1e-2,
                             max_steps=max_steps, save_steps=save_steps, logging_steps=1, disable_tqdm=True,
                             report_to="none", seed=1)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=TokenData())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def losses(trainer):
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def logits(model, ids):
    model.eval()
    out = model(paddle.to_tensor(ids))
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


def test_auto_model_for_causal_lm_loads_a_single_process_checkpoint_with_the_trained_logits(tmp_path):
    from paddlenlp.transformers import AutoModelForCausalLM

    trainer = train(tmp_path / "run", max_steps=3, save_steps=3)
    ckpt = str(tmp_path / "run" / "checkpoint-3")
    index = read_index(ckpt)
    shard = L.model_file_name(0, 0)
    with open(os.path.join(ckpt, L.HF_WEIGHTS_INDEX_NAME)) as f:
        hf = json.load(f)
    names = list(trainer.model.state_dict())
    assert hf["weight_map"] == {n: shard for n in sorted(names)}  # points at our shard: no second weights copy
    assert not os.path.exists(os.path.join(ckpt, "model.safetensors"))
    assert L.HF_WEIGHTS_INDEX_NAME in index["files"]  # checksummed and published with the rest
    with safe_open(os.path.join(ckpt, shard), framework="np") as f:
        assert sorted(f.keys()) == sorted(names)  # bare state_dict names, as from_pretrained reads them

    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    assert type(loaded) is type(trainer.model)
    ids = TokenData().rows[:2]
    np.testing.assert_array_equal(logits(loaded, ids), logits(trainer.model, ids))


def to_format_version_1(src, dst):
    """Rewrite a checkpoint exactly as paddletrainer wrote it before format version 2: model tensors stored under
    their global key ``model/<name>`` in the shard, pieces without ``key``, no HF index."""
    shutil.copytree(src, dst)
    index = read_index(dst)
    for name in [n for n in index["files"] if n.startswith("model_state.")]:
        path = os.path.join(dst, name)
        with safe_open(path, framework="np") as f:
            arrays = {L.MODEL_PREFIX + k: f.get_tensor(k) for k in f.keys()}
        index["files"][name] = write_safetensors(path, arrays)
    for t in index["tensors"].values():
        for p in t["pieces"]:
            del p["key"]
    del index["files"][L.HF_WEIGHTS_INDEX_NAME], index["hf_weights_index"]
    os.remove(os.path.join(dst, L.HF_WEIGHTS_INDEX_NAME))
    index["version"] = 1
    with open(os.path.join(dst, L.INDEX_NAME), "w") as f:
        json.dump(index, f)
    return index


def test_a_checkpoint_of_format_version_1_resumes_onto_the_uninterrupted_loss_curve(tmp_path):
    full = train(tmp_path / "full", max_steps=5, save_steps=3)
    old = str(tmp_path / "old" / "checkpoint-3")
    to_format_version_1(str(tmp_path / "full" / "checkpoint-3"), old)
    with safe_open(os.path.join(old, L.model_file_name(0, 0)), framework="np") as f:
        assert all(k.startswith(L.MODEL_PREFIX) for k in f.keys())
    assert L.whole_weight_map(read_index(old))[0] is None  # not loadable by from_pretrained, and not claimed to be

    resumed = train(tmp_path / "resumed", max_steps=5, save_steps=100, resume=old)
    want, got = losses(full), losses(resumed)
    assert resumed.state.global_step == 5 and 4 in got  # steps 1-3 in the history come from the checkpoint
    np.testing.assert_allclose([got[4], got[5]], [want[4], want[5]], rtol=1e-6)
    for name, p in full.model.state_dict().items():
        np.testing.assert_allclose(resumed.model.state_dict()[name].numpy(), p.numpy(), rtol=1e-6, err_msg=name)


def _index(entries):
    files = {e.file: {"size": 0, "crc32": 0} for e in entries}
    return L.build_index(entries, files, {})


def test_weights_split_by_tensor_parallel_or_stage3_or_stored_as_bfloat16_get_no_hf_index():
    whole = [L.PieceEntry("model/w", "float32", L.replicated((4, 2)), 0, "model_state.tp00_pp00.safetensors"),
             L.PieceEntry("model/b", "float32", L.replicated((2,)), 1, "model_state.tp00_pp01.safetensors"),
             L.PieceEntry("optim/w/moment1", "float32", L.replicated((4, 2)), 0, "optimizer.tp00_pp00_shard00.safetensors")]
    weight_map, _ = L.whole_weight_map(_index(whole))
    assert weight_map == {"w": "model_state.tp00_pp00.safetensors", "b": "model_state.tp00_pp01.safetensors"}
    hf = L.hf_weights_index(_index(whole), weight_map)
    assert hf["metadata"]["total_size"] == (8 + 2) * 4

    tp = [L.PieceEntry("model/w", "float32", L.tp_placement((4, 1), 1, r, 2), r, f"model_state.tp0{r}_pp00.safetensors")
          for r in range(2)]
    assert L.whole_weight_map(_index(tp)) == (None, "model/w is stored in 2 slices (tensor parallel or sharding stage 3)")
    stage3 = [L.PieceEntry("model/w", "float32", L.flat_placement(L.replicated((4, 2)), 4 * r, 4 * r + 4), r,
                           f"model_state.tp00_pp00_shard0{r}.safetensors") for r in range(2)]
    assert L.whole_weight_map(_index(stage3))[0] is None
    bf16 = [L.PieceEntry("model/w", "bfloat16", L.replicated((4, 2)), 0, "model_state.tp00_pp00.safetensors")]
    assert "bfloat16" in L.whole_weight_map(_index(bf16))[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hf_index_is_written_exactly_when_the_weights_are_whole_and_labelled(tmp_path, dtype):
    from paddletrainer.checkpoint import load_checkpoint, save_checkpoint

    model = paddle.nn.Linear(4, 3)
    model.to(dtype=dtype)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    index = read_index(ckpt)
    written = os.path.exists(os.path.join(ckpt, L.HF_WEIGHTS_INDEX_NAME))
    assert written == (dtype == "float32") == index["hf_weights_index"]["written"]
    if written:
        size = os.path.getsize(os.path.join(ckpt, L.HF_WEIGHTS_INDEX_NAME))
        assert index["files"][L.HF_WEIGHTS_INDEX_NAME] == {
            "size": size, "crc32": zlib.crc32(open(os.path.join(ckpt, L.HF_WEIGHTS_INDEX_NAME), "rb").read())}
    again = paddle.nn.Linear(4, 3)
    again.to(dtype=dtype)
    load_checkpoint(ckpt, model=again)
    np.testing.assert_array_equal(again.weight.numpy(), model.weight.numpy())
