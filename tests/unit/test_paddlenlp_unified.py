"""PaddleNLP's unified checkpoints (``--unified_checkpoint true``): a one-process one resumes on PaddleNLP's own
resumed losses; what a named directory that is not a checkpoint of ours is called. (dp2-written, resharded:
tests/distributed/test_paddlenlp_unified_checkpoint.py.)"""
import json
import os

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.paddlenlp_unified import unified_checkpoint_index
from paddletrainer.checkpoint.paddlenlp_unified_export import export_paddlenlp_unified
from paddletrainer.trainer_utils import (get_last_checkpoint, is_paddlenlp_unified_checkpoint,
                                         resolve_resume_checkpoint)
from paddlenlp_runs import SEQ, VOCAB, loss_log, sequential_sampler, token_data

COMMON = dict(max_steps=6, logging_steps=1, learning_rate=1e-2, per_device_train_batch_size=2, seed=3,
              lr_scheduler_type="linear", warmup_steps=0, report_to="none", disable_tqdm=True)


def tiny_llama(seed):
    transformers = pytest.importorskip("paddlenlp.transformers")
    paddle.seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=SEQ, seq_length=SEQ, rms_norm_eps=1e-6,
        use_flash_attention=False, use_fused_rms_norm=False, tie_word_embeddings=False, dtype="float32"))


def paddlenlp_run(output_dir, resume=None):
    """PaddleNLP's Trainer writing unified checkpoints at step 3 and 6; its per-step losses."""
    nlp = pytest.importorskip("paddlenlp.trainer")
    losses = {}
    log = loss_log(nlp.TrainerCallback, losses)
    with paddle.utils.unique_name.guard():  # as in its own process: optimizer states are keyed by generated names
        trainer = type("NLPTrainer", (nlp.Trainer,), {"_get_train_sampler": sequential_sampler})(
            model=tiny_llama(2024), train_dataset=token_data(), callbacks=[log()],
            args=nlp.TrainingArguments(output_dir=str(output_dir), save_steps=3, unified_checkpoint=True, **COMMON))
        trainer.train(resume_from_checkpoint=resume)
    return losses


@pytest.fixture(scope="module")
def unified(tmp_path_factory):
    root = tmp_path_factory.mktemp("unified")
    paddlenlp_run(root / "nlp")
    checkpoint = str(root / "nlp" / "checkpoint-3")
    return checkpoint, paddlenlp_run(root / "nlp_resumed", resume=checkpoint)


def test_a_one_process_unified_checkpoint_resumes_on_paddlenlp_own_resumed_losses(tmp_path, unified):
    checkpoint, theirs = unified
    names = os.listdir(checkpoint)
    assert "model.safetensors.index.json" in names and "optimizer.safetensors.index.json" in names
    assert is_paddlenlp_unified_checkpoint(checkpoint)
    assert get_last_checkpoint(os.path.dirname(checkpoint)).endswith("checkpoint-6")
    losses, ours = our_run(tmp_path / "ours", seed=7, resume=checkpoint)  # other weights: all from the checkpoint
    assert ours.state.global_step == 6 and sorted(theirs) == sorted(losses) == [4, 5, 6]
    np.testing.assert_allclose([losses[s] for s in (4, 5, 6)], [theirs[s] for s in (4, 5, 6)], rtol=0, atol=1e-5)
    assert ours.lr_scheduler.last_epoch == 6  # the schedule came from scheduler.pdparams


def our_run(output_dir, seed, resume=None, **options):
    """Our Trainer on the same batches; its per-step losses and the trainer."""
    losses = {}
    log = loss_log(TrainerCallback, losses)
    with paddle.utils.unique_name.guard():
        ours = type("Ours", (Trainer,), {"_get_train_sampler": sequential_sampler})(
            tiny_llama(seed), train_dataset=token_data(), callbacks=[log()],
            args=TrainingArguments(output_dir=str(output_dir), **COMMON, **options))
        ours.train(resume_from_checkpoint=resume)
    return losses, ours


def test_an_exported_checkpoint_of_ours_resumes_in_paddlenlp_on_our_losses(tmp_path):
    ours, _ = our_run(tmp_path / "ours", seed=2024, save_steps=3)
    exported = str(tmp_path / "nlp" / "checkpoint-3")
    export_paddlenlp_unified(str(tmp_path / "ours" / "checkpoint-3"), exported)
    assert is_paddlenlp_unified_checkpoint(exported)
    theirs = paddlenlp_run(tmp_path / "nlp_resumed", resume=exported)
    assert sorted(theirs) == [4, 5, 6]
    np.testing.assert_allclose([theirs[s] for s in (4, 5, 6)], [ours[s] for s in (4, 5, 6)], rtol=0, atol=1e-5)
    with pytest.raises(CheckpointError, match="is not empty"):
        export_paddlenlp_unified(str(tmp_path / "ours" / "checkpoint-3"), exported)


def test_unified_index_maps_paddlenlp_keys_onto_ours_and_names_a_missing_file(tmp_path, unified):
    checkpoint, _ = unified
    index, _ = unified_checkpoint_index(checkpoint)
    assert index["tensors"]["model/llama.embed_tokens.weight"]["shape"] == [VOCAB, 32]
    assert index["tensors"]["optim/llama.embed_tokens.weight/moment1"]["dtype"] == "float32"
    assert "optim/llama.norm.weight/beta2_pow_acc" in index["tensors"]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(checkpoint):
        if not name.startswith("optimizer-"):
            (broken / name).write_bytes(open(os.path.join(checkpoint, name), "rb").read())
    with pytest.raises(CheckpointError, match=r"optimizer.safetensors.index.json names optimizer-00001-of-00001"
                                              r".safetensors, which is missing"):
        unified_checkpoint_index(str(broken))


def test_a_named_directory_is_called_what_it_is_never_an_unfinished_save(tmp_path):
    foreign = tmp_path / "checkpoint-5"
    foreign.mkdir()
    (foreign / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"is not a paddletrainer checkpoint \(found: \['weights.bin'\]\)"):
        resolve_resume_checkpoint(str(foreign), None)
    unfinished = tmp_path / "checkpoint-6"  # PaddleNLP writes trainer_state.json last
    unfinished.mkdir()
    (unfinished / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match=r"is a PaddleNLP checkpoint whose save did not finish \(it has "
                                         r"model.safetensors.index.json but no trainer_state.json"):
        resolve_resume_checkpoint(str(unfinished), None)
    (unfinished / "trainer_state.json").write_text("{}")
    assert resolve_resume_checkpoint(str(unfinished), None) == str(unfinished)
    ours = tmp_path / "checkpoint-7"  # ours, its marker not yet written
    ours.mkdir()
    (ours / "checkpoint_index.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is incomplete \(no completion marker: its save did not finish\)"):
        resolve_resume_checkpoint(str(ours), None)


def test_unified_checkpoint_says_what_it_changes_and_the_export_script_names_a_bad_directory(tmp_path, caplog):
    import subprocess
    import sys

    with caplog.at_level("WARNING", logger="paddletrainer"):
        TrainingArguments(output_dir=str(tmp_path / "o"), unified_checkpoint=True)
    assert "does not write PaddleNLP's unified files" in caplog.text
    assert "`paddletrainer-export-paddlenlp-unified <checkpoint-N> <new dir>`" in caplog.text
    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    script = os.path.join(repo, "scripts", "export_paddlenlp_unified.py")
    # the tool the warning names (its module; the console script runs the same main) and the checkout's wrapper
    for command in ([sys.executable, "-m", "paddletrainer.tools.export_paddlenlp_unified"], [sys.executable, script]):
        proc = subprocess.run([*command, str(tmp_path / "missing"), str(tmp_path / "out")], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": os.path.abspath(repo)})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "paddletrainer-export-paddlenlp-unified: error:" in proc.stderr
        assert "is not a complete checkpoint" in proc.stderr


def test_a_truncated_unified_file_is_named_not_read_past_its_end(tmp_path, unified):
    checkpoint, _ = unified
    for name in os.listdir(checkpoint):
        data = open(os.path.join(checkpoint, name), "rb").read()
        (tmp_path / name).write_bytes(data[:-64] if name.startswith("model-") else data)
    with pytest.raises(CheckpointError, match=r"model-00001-of-00001.safetensors: not a safetensors file "
                                              r"\(header field .*data_offsets: .* inside the \d+ data bytes"):
        unified_checkpoint_index(str(tmp_path))


def test_master_weights_this_run_keeps_start_from_the_loaded_fp32_weights(unified):
    from safetensors.numpy import load_file

    from paddletrainer.checkpoint.paddlenlp_unified import load_paddlenlp_unified_checkpoint

    checkpoint, _ = unified
    with paddle.utils.unique_name.guard():
        model = tiny_llama(7)
        model.to(dtype="bfloat16")  # pure bf16 weights: the optimizer keeps fp32 master weights
        optimizer = paddle.optimizer.AdamW(parameters=model.parameters(), multi_precision=True)
        loaded = load_paddlenlp_unified_checkpoint(checkpoint, model=model, optimizer=optimizer)
    assert loaded.optimizer_restored
    saved = load_file(os.path.join(checkpoint, "model-00001-of-00001.safetensors"))
    masters = optimizer._master_weights
    names = {p.name: n for n, p in model.state_dict().items()}
    assert masters and all(names[p] in saved for p in masters)
    for pname, master in masters.items():  # fp32 values, not the bf16-rounded model weights nor the initial ones
        np.testing.assert_array_equal(master.numpy(), saved[names[pname]])
