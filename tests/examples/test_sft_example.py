"""The SFT example (llm_examples/sft/run_finetune.py) runs end to end on a slice of the reviews, in seconds: the
prompt tokens carry no label, the pairs are packed several to a row, the model and tokenizer are saved where the DPO
example looks for them, and the last line is the accuracy line the README quotes."""
import re
import subprocess

import pytest

from .helpers import PYTHON, REPO, load_module, run_script, script_env, trainer_ready

pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import yet")

SFT = REPO / "llm_examples" / "sft"
LAST_LINE = re.compile(r"test accuracy: sft (\d\.\d{4}), bag-of-characters logistic regression (\d\.\d{4}) "
                       r"\(same (\d+) test reviews\)")
SLICE = ["--max_source_lines", "400", "--max_test_reviews", "12", "--max_steps", "3", "--logging_steps", "1",
         "--max_seq_length", "128", "--per_device_train_batch_size", "2", "--tokenizer_vocab_size", "3000"]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_quick")
    proc = run_script([SFT / "run_finetune.py", SFT / "quickstart.json", "--output_dir", out, *SLICE], cwd=REPO)
    return proc.stdout.strip().splitlines(), out


@pytest.fixture(scope="module")
def sft_module():
    return load_module(SFT / "run_finetune.py", "sft_run_finetune")


def test_sft_quick_run_ends_with_the_accuracy_line_on_the_test_reviews(sft_run):
    lines, _ = sft_run
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    assert int(match.group(3)) == 12
    assert 0.0 <= float(match.group(1)) <= 1.0 and 0.5 <= float(match.group(2)) <= 1.0


def test_sft_saves_a_plain_llama_and_its_tokenizer_for_the_dpo_example(sft_run, sft_module):
    _, out = sft_run
    from paddlenlp.transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert '"LlamaForCausalLM"' in (out / "config.json").read_text()
    assert model.config.vocab_size == len(tokenizer) == 3000


def test_sft_pairs_train_only_the_answer_and_pack_several_to_a_row(sft_run, sft_module):
    _, out = sft_run
    from paddlenlp.transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    pairs = sft_module.review_instructions.load_instruction_pairs("train", 120, max_lines=400)[:40]
    record = sft_module.tokenize_pair(tokenizer, pairs[0])
    prompt = sft_module.prompt_ids(tokenizer, pairs[0]["prompt"])
    answer = tokenizer(pairs[0]["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert record["input_ids"] == prompt + answer[:-1]
    assert record["labels"] == [-100] * (len(prompt) - 1) + answer

    rows = sft_module.build_train_dataset(tokenizer, pairs, packing=True, max_seq_length=256)
    records = [sft_module.tokenize_pair(tokenizer, pair) for pair in pairs]
    assert len(rows) < len(pairs) // 2
    packed_labels = sorted(t for i in range(len(rows)) for t in rows[i]["labels"] if t != -100)
    assert packed_labels == sorted(t for r in records for t in r["labels"] if t != -100)
    starts = sum(int(p == 0) for i in range(len(rows)) for p in rows[i]["position_ids"])
    assert starts == len(pairs)  # every pair starts its own document inside a row
    assert all(len(rows[i]["input_ids"]) <= 256 for i in range(len(rows)))


def test_sft_bad_option_is_a_one_line_usage_error(tmp_path):
    proc = subprocess.run([PYTHON, str(SFT / "run_finetune.py"), str(SFT / "quickstart.json"),
                           "--output_dir", str(tmp_path), "--max_new_tokens", "0"],
                          cwd=str(REPO), env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--max_new_tokens must be >= 1" in proc.stderr and "Traceback" not in proc.stderr
