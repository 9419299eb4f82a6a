"""Fuzz of ``PdArgumentParser(TrainingArguments)``: bad values of every kind, generated from the fields' types
(wrong types, NaN/inf, negatives where nonsense, huge values, non-UTF-8 bytes, directories and non-UTF-8 files as
config files), each end as a usage error naming the option: ``SystemExit(2)``, ``error: argument --<option>: ...``
and no other exception. A few of them also run as real scripts (exit status 2, no traceback)."""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Union, get_args, get_origin, get_type_hints

import pytest

from paddletrainer.config import arg_checks
from paddletrainer.config.arg_checks import INT32_MAX, MAX_DATALOADER_WORKERS
from paddletrainer.argparser import PdArgumentParser
from paddletrainer.training_args import TrainingArguments

REPO = Path(__file__).resolve().parents[2]
USER_SCRIPT = REPO / "tests" / "unit" / "fixtures" / "user_train_script.py"
NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # how Python hands non-UTF-8 argv bytes to a script (lone surrogates)


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for key in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def _kind(hint):
    """'int' | 'float' | 'bool' | 'str' | 'list' | 'other' of a field's annotation (Optional peeled)."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is Union and len(args) == 1:
        hint = args[0]
    if get_origin(hint) in (list, List):
        return "list"
    return {int: "int", float: "float", bool: "bool", str: "str"}.get(hint, "other")


HINTS = get_type_hints(TrainingArguments)
FIELDS = {f.name: _kind(HINTS[f.name]) for f in dataclasses.fields(TrainingArguments) if f.init}
# int fields for which a negative value means nothing (the others use -1 as "unset" or "off", as in PaddleNLP)
NEGATIVE_IS_NONSENSE = ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                        "eval_accumulation_steps", "warmup_steps", "seed", "dataloader_num_workers", "eval_steps",
                        "nan_inf_rollback_max_retries", "collective_timeout_seconds", "sharding_stage3_segment_size"]
NEGATIVE_FLOAT_IS_NONSENSE = ["learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                              "num_train_epochs", "warmup_ratio", "lr_end", "min_learning_rate", "scale_loss",
                              "peak_flops_per_device", "nan_inf_rollback_lr_factor"]


def _cases():
    for name, kind in FIELDS.items():
        if kind == "int":
            for value in ("abc", "1e20", "1.5", "", "99999999999999999999", NOT_UTF8):
                yield name, value
        elif kind == "float":
            for value in ("nan", "NaN", "inf", "-inf", "1e400", "abc", ""):
                yield name, value
        elif kind == "bool":
            for value in ("maybe", "2", NOT_UTF8):
                yield name, value
        elif kind in ("str", "list") and name != "output_dir":
            yield name, NOT_UTF8
    yield from ((name, "-1") for name in NEGATIVE_IS_NONSENSE)
    yield from ((name, "-0.5") for name in NEGATIVE_FLOAT_IS_NONSENSE)
    yield from [("per_device_train_batch_size", str(INT32_MAX + 1)), ("per_device_eval_batch_size", str(2**40)),
                ("dataloader_num_workers", "1000000"), ("dataloader_num_workers", str(MAX_DATALOADER_WORKERS + 1)),
                ("adam_beta1", "1.0"), ("adam_beta2", "1.5"), ("seed", str(2**32)), ("scale_loss", "0"),
                ("output_dir", NOT_UTF8)]


CASES = list(_cases())


def usage_error_of(capsys, call) -> str:
    """Run ``call``; it must end as a usage error (SystemExit 2, usage line first). Returns the error line."""
    with pytest.raises(SystemExit) as info:
        call()
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("usage: ") and len(lines) == 2, err
    return lines[-1]


def parse_cli(argv):
    return PdArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv, look_for_args_file=False)


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_every_bad_value_of_every_option_is_a_usage_error_naming_it(capsys, tmp_path, name, value):
    output_dir = [] if name == "output_dir" else ["--output_dir", str(tmp_path)]
    error = usage_error_of(capsys, lambda: parse_cli([*output_dir, f"--{name}", value]))
    assert f"error: argument --{name}: " in error, error


@pytest.mark.parametrize("alias", sorted(TrainingArguments._option_aliases))
def test_a_bad_degree_given_under_an_alias_names_the_alias(capsys, tmp_path, alias):
    error = usage_error_of(capsys, lambda: parse_cli(["--output_dir", str(tmp_path), f"--{alias}", "5"]))
    assert f"error: argument --{alias}: " in error, error


def test_an_unknown_option_with_non_utf8_bytes_is_named_escaped(capsys, tmp_path):
    error = usage_error_of(capsys, lambda: parse_cli(["--output_dir", str(tmp_path), f"--{NOT_UTF8}", "1"]))
    assert "unknown option(s) --\\udcff\\udcfe" in error, error


def test_a_subclass_whose_annotations_do_not_resolve_is_still_checked(tmp_path):
    namespace = {}
    exec("from __future__ import annotations\n"  # a script's subclass naming a type only it imports
         "import dataclasses\n"
         "from paddletrainer import TrainingArguments\n"
         "@dataclasses.dataclass\n"
         "class ScriptArguments(TrainingArguments):\n"
         "    tokenizer_hint: ScriptOnlyType = None\n", namespace)
    with pytest.raises(ValueError, match="^learning_rate=nan is invalid: must be a finite number"):
        namespace["ScriptArguments"](output_dir=str(tmp_path), learning_rate=float("nan"))


def test_the_generated_cases_cover_every_numeric_and_bool_option():
    covered = {name for name, _ in CASES}
    assert {n for n, k in FIELDS.items() if k in ("int", "float", "bool")} <= covered
    assert {"learning_rate", "num_train_epochs", "warmup_ratio", "max_grad_norm", "adam_epsilon"} <= covered


@pytest.mark.parametrize("key,value", [("learning_rate", float("nan")), ("num_train_epochs", float("inf")),
                                       ("warmup_ratio", float("nan")), ("max_grad_norm", float("-inf")),
                                       ("per_device_train_batch_size", 1e20), ("dataloader_num_workers", 10**6),
                                       ("seed", 10**30), ("learning_rate", 10**400), ("output_dir", "\udcff")],
                         ids=["nan_lr", "inf_epochs", "nan_warmup", "-inf_clip", "1e20_batch", "1e6_workers",
                              "huge_seed", "lr_beyond_float", "not_utf8_path"])
def test_bad_values_in_a_json_config_are_usage_errors_naming_the_option(capsys, tmp_path, key, value):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path), key: value}))  # NaN/Infinity as Python's json writes
    error = usage_error_of(capsys, lambda: PdArgumentParser(TrainingArguments).parse_json_file(str(cfg)))
    assert f"error: argument --{key}: " in error and "cfg.json" in error, error


def test_nan_and_inf_in_a_yaml_config_are_usage_errors_naming_the_option(capsys, tmp_path):
    for key, value in (("learning_rate", ".nan"), ("num_train_epochs", ".inf"), ("warmup_ratio", "-.inf")):
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(f"output_dir: {tmp_path}\n{key}: {value}\n")
        error = usage_error_of(capsys, lambda: PdArgumentParser(TrainingArguments).parse_yaml_file(str(cfg)))
        assert f"error: argument --{key}: " in error, error


def _bad_config_files(tmp_path):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "latin1.json").write_bytes(b'{"output_dir": "caf\xe9"}')
    (tmp_path / "latin1.yaml").write_bytes(b"output_dir: caf\xe9\n")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "intkey.yaml").write_text("1: 2\noutput_dir: out\n")
    (tmp_path / "list.yaml").write_text("- output_dir\n")
    return [("dir.json", "Is a directory"), ("dir.yaml", "Is a directory"), ("latin1.json", "not UTF-8"),
            ("latin1.yaml", "not UTF-8"), ("deep.json", "nested too deeply"), ("intkey.yaml", "must be text"),
            ("list.yaml", "top level must be a mapping")]


@pytest.mark.parametrize("how", ["parse_file", "file_then_cmd_lines"])
def test_bad_config_files_are_usage_errors_naming_the_file(capsys, monkeypatch, tmp_path, how):
    for name, expected in _bad_config_files(tmp_path):
        path = str(tmp_path / name)
        parser = PdArgumentParser(TrainingArguments)
        yaml = name.endswith(".yaml")
        if how == "parse_file":
            call = parser.parse_yaml_file if yaml else parser.parse_json_file
            error = usage_error_of(capsys, lambda: call(path))
        else:
            monkeypatch.setattr(sys, "argv", ["train.py", path, "--seed", "3"])
            call = parser.parse_yaml_file_and_cmd_lines if yaml else parser.parse_json_file_and_cmd_lines
            error = usage_error_of(capsys, call)
        assert f"error: {path}: " in error and expected in error, error


def test_a_bad_args_file_is_a_usage_error_naming_it(capsys, tmp_path):
    args_dir = tmp_path / "dir.args"
    args_dir.mkdir()
    latin1 = tmp_path / "latin1.args"
    latin1.write_bytes(b"--output_dir caf\xe9")
    for path, expected in ((args_dir, "Is a directory"), (latin1, "not UTF-8")):
        parser = PdArgumentParser(TrainingArguments)
        error = usage_error_of(capsys, lambda: parser.parse_args_into_dataclasses([], args_filename=str(path)))
        assert f"error: {path}: {expected}" in error, error


def test_paddlenlp_defaults_and_sentinels_still_parse(tmp_path):
    (args,) = parse_cli(["--output_dir", str(tmp_path)])
    assert args.device == "gpu" and args.seed == 42 and args.max_steps == -1
    (args,) = parse_cli(["--output_dir", str(tmp_path), "--max_steps", "-1", "--save_total_limit", "-1",
                         "--past_index", "-1", "--max_evaluate_steps", "-1", "--local_rank", "-1",
                         "--sharding_comm_buffer_size_MB", "-1", "--tensor_parallel_degree", "-1",
                         "--max_grad_norm", "0", "--num_train_epochs", "0.5", "--eval_steps", "0",
                         "--seed", str(2**32 - 1), "--dataloader_num_workers", str(MAX_DATALOADER_WORKERS),
                         "--per_device_train_batch_size", str(INT32_MAX), "--adam_beta2", "0.999"])
    assert (args.seed, args.per_device_train_batch_size, args.dataloader_num_workers) == (
        2**32 - 1, INT32_MAX, MAX_DATALOADER_WORKERS)


@pytest.mark.parametrize("cpus", [1, 2, 64])
def test_the_dataloader_workers_bound_is_the_same_on_every_machine(tmp_path, monkeypatch, caplog, cpus):
    """Ranks bound to fewer CPUs (NUMA binding, mixed nodes) accept and refuse exactly what the others do: an
    error on some ranks only would leave the rest waiting in a collective. Above the local CPUs: a warning."""
    monkeypatch.setattr(arg_checks, "usable_cpus", lambda: cpus)
    with caplog.at_level("WARNING"):
        (args,) = parse_cli(["--output_dir", str(tmp_path), "--dataloader_num_workers", "16"])
    assert args.dataloader_num_workers == 16
    assert any("more than the" in r.getMessage() for r in caplog.records) == (cpus < 16)
    with pytest.raises(SystemExit):
        parse_cli(["--output_dir", str(tmp_path), "--dataloader_num_workers", str(MAX_DATALOADER_WORKERS + 1)])


def test_direct_construction_refuses_the_same_values(tmp_path):
    for key, value, expected in [("learning_rate", float("nan"), "finite"), ("warmup_ratio", float("inf"), "finite"),
                                 ("adam_beta1", 1.0, "[0, 1)"), ("seed", -1, "unsigned 32-bit"),
                                 ("per_device_train_batch_size", 10**20, "64-bit"),
                                 ("per_device_eval_batch_size", 2**31, "2**31 - 1"),
                                 ("dataloader_num_workers", 10**6, f"<= {MAX_DATALOADER_WORKERS}")]:
        with pytest.raises(ValueError, match=f"^{key}=.*{re.escape(expected)}"):
            TrainingArguments(output_dir=str(tmp_path), **{key: value})


def test_samples_per_step_beyond_a_per_device_batch_s_bound_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=2147483647 x gradient_accumulation_steps="
                                         r"2147483647 x 4 data rank\(s\) \(dp x sharding\) .* \(2\*\*31 - 1"):
        TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=INT32_MAX,
                          gradient_accumulation_steps=INT32_MAX)


@pytest.mark.parametrize("argv,option", [
    (["--dataloader_num_workers", "1000000"], "dataloader_num_workers"),
    (["--per_device_train_batch_size", "100000000000000000000"], "per_device_train_batch_size"),
    (["--learning_rate", "nan"], "learning_rate"),
    ([b"--run_name", b"caf\xe9"], "run_name"),  # Latin-1 bytes in argv
])
def test_a_real_script_ends_a_bad_value_with_exit_2_and_no_traceback(tmp_path, argv, option):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(USER_SCRIPT), "--output_dir", str(tmp_path), *argv], env=env,
                          capture_output=True, text=True, errors="replace", timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"user_train_script.py: error: argument --{option}: "), proc.stderr
