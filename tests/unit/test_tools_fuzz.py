"""Fuzz of the console tools and of the options given as JSON: every bad input to ``paddletrainer-plan`` and
``paddletrainer-merge-checkpoint`` (huge or zero numbers, NaN/inf, a config that is a directory, a FIFO,
``/dev/zero`` or deeply nested, an ``out_dir`` that is a file or cannot be made, a missing ``--base-model`` or
``--config-from``) ends as one ``error:`` line with exit status 2 within seconds, never a traceback or a hang;
``lr_scheduler_kwargs`` is checked as its keys are as options of their own; a batch sampler that dies in the
loader's thread ends the run with its error."""
import json
import os
import subprocess
import sys
import textwrap

import paddle
import pytest

from paddletrainer.argparser import PdArgumentParser
from paddletrainer.checkpoint import save_checkpoint
from paddletrainer.tools import merge_checkpoint as merge_tool
from paddletrainer.tools import plan as plan_tool
from paddletrainer.training_args import TrainingArguments
from deadline import within

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = ["--hidden-size", "1024", "--num-layers", "8", "--num-heads", "16", "--intermediate-size", "2816",
         "--vocab-size", "32000", "--seq-length", "1024"]
RUN = ["--devices", "8", "--global-batch", "8"]
GOOD_CONFIG = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "vocab_size": 32000,
               "intermediate_size": 2816, "seq_length": 1024}


def one_error_line(capsys, main, argv, seconds=20) -> str:
    """``main(argv)`` ends as a usage error (exit 2) within ``seconds``; its last stderr line."""
    with within(seconds), pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _config(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def plan_cases(tmp_path):
    """(case, argv, what the error line names)."""
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    bad = {k: dict(GOOD_CONFIG, **v) for k, v in {
        "nan": {"hidden_size": float("nan")}, "inf": {"vocab_size": float("inf")},
        "huge": {"num_hidden_layers": 10**30}, "bool": {"num_attention_heads": True},
        "text": {"intermediate_size": "2816"}, "zero_seq": {"seq_length": -5}}.items()}
    yield "devices_1e9", [*SIZES, "--devices", "1000000000", "--global-batch", "8"], "--devices"
    yield "global_batch_1e12", [*SIZES, "--devices", "8", "--global-batch", str(10**12)], "--global-batch"
    yield "seq_length_0", [*SIZES[:-1], "0", *RUN], "--seq-length"
    yield "seq_length_0_with_config", [_config(tmp_path, "ok.json", json.dumps(GOOD_CONFIG)), "--seq-length", "0",
                                       *RUN], "--seq-length"
    yield "hidden_1e30", [*SIZES[:1], str(10**30), *SIZES[2:], *RUN], "--hidden-size"
    yield "max_micro_batch_1e20", [*SIZES, *RUN, "--max-micro-batch", str(10**20)], "--max-micro-batch"
    yield "devices_per_node_0", [*SIZES, *RUN, "--devices-per-node", "0"], "--devices-per-node"
    for opt in ("--device-memory", "--peak-tflops", "--efficiency"):
        for value in ("nan", "inf", "-inf"):
            yield f"{opt}={value}", [*SIZES, *RUN, opt, value], opt
    yield "efficiency_2", [*SIZES, *RUN, "--efficiency", "2"], "--efficiency"
    yield "config_directory", [str(tmp_path / "dir.json"), *RUN], "s a directory"
    yield "config_fifo", [str(tmp_path / "fifo.json"), *RUN], "not a regular file"
    yield "config_dev_zero", ["/dev/zero", *RUN], "not a regular file"
    yield "config_deep", [_config(tmp_path, "deep.json", "[" * 100000 + "]" * 100000), *RUN], "nested too deeply"
    yield "config_a_list", [_config(tmp_path, "list.json", "[1]"), *RUN], "not a JSON object"
    yield "config_latin1", [_config(tmp_path, "latin1.json", b'{"hidden_size": "caf\xe9"}'), *RUN], "config"
    for name, doc in bad.items():
        yield f"config_{name}", [_config(tmp_path, f"{name}.json", json.dumps(doc)), *RUN], "is invalid"


PLAN_CHILD = """
import contextlib, io, json, resource, signal, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))  # /dev/zero read whole
from paddletrainer.tools import plan
def expire(*_):
    raise TimeoutError("still running after 20 s")
signal.signal(signal.SIGALRM, expire)
for case, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    signal.alarm(20)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            plan.main(argv)
        out = {"code": 0}
    except SystemExit as e:
        out = {"code": e.code}
    except BaseException as e:
        out = {"code": None, "raised": f"{type(e).__name__}: {str(e)[:200]}"}
    signal.alarm(0)
    print(json.dumps({"case": case, "stderr": err.getvalue(), **out}), flush=True)
"""


def test_every_bad_plan_input_is_one_error_line_within_seconds(tmp_path):
    """In a child process whose memory is capped (a config read until memory runs out must not take the
    machine with it), each case interrupted after 20 s."""
    cases = list(plan_cases(tmp_path))
    proc = subprocess.run([sys.executable, "-c", PLAN_CHILD, json.dumps([(c, argv) for c, argv, _ in cases])],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    results = {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
    failures = []
    for case, _, expected in cases:
        r = results.get(case, {"code": None, "raised": f"the child died: {proc.stderr[-300:]}", "stderr": ""})
        line = (r["stderr"].strip().splitlines() or [""])[-1]
        if r["code"] != 2 or "Traceback" in r["stderr"] or not line.startswith("paddletrainer-plan: error:") \
                or expected not in line:
            failures.append(f"{case}: exit {r['code']} {r.get('raised', '')} {line[:300]}")
    assert not failures, "\n".join(failures)


def test_the_control_the_plan_of_a_good_config_still_prints(tmp_path, capsys):
    assert plan_tool.main([_config(tmp_path, "ok.json", json.dumps(GOOD_CONFIG)), *RUN]) == 0
    assert "layouts fit" in capsys.readouterr().out


@pytest.fixture(scope="module")
def whole_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    paddle.seed(1)
    ckpt = save_checkpoint(str(root / "checkpoint-1"), model=paddle.nn.Linear(2, 3))
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps({"architectures": ["Linear"]}))
    return ckpt, str(root / "model")


def merge_cases(tmp_path, ckpt, model_dir):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "no_config").mkdir()
    yield "out_dir_a_file", [ckpt, str(tmp_path / "a_file")], "is not a directory"
    yield "out_dir_under_a_file", [ckpt, str(tmp_path / "a_file" / "sub")], "cannot be created"
    yield "out_dir_under_proc", [ckpt, "/proc/paddletrainer-merge-out"], "cannot be created"
    yield "base_model_missing", [ckpt, str(tmp_path / "o1"), "--base-model", str(tmp_path / "none")], "--base-model"
    yield "config_from_missing", [ckpt, str(tmp_path / "o2"), "--config-from", str(tmp_path / "none")], "--config-from"
    yield "config_from_without_config", [ckpt, str(tmp_path / "o3"), "--config-from", str(tmp_path / "no_config")],\
        "--config-from"
    yield "no_config_anywhere", [ckpt, str(tmp_path / "o4")], "stores no model config"
    yield "ckpt_missing", [str(tmp_path / "none"), str(tmp_path / "o5")], "none"
    yield "ckpt_a_file", [str(tmp_path / "a_file"), str(tmp_path / "o6")], "a_file"
    yield "ckpt_dev_zero", ["/dev/zero", str(tmp_path / "o7")], "/dev/zero"


def test_every_bad_merge_input_is_one_error_line_within_seconds(tmp_path, capsys, whole_checkpoint):
    ckpt, model_dir = whole_checkpoint
    failures = []
    for case, argv, expected in merge_cases(tmp_path, ckpt, model_dir):
        try:
            line = one_error_line(capsys, merge_tool.main, argv)
        except BaseException as e:  # noqa: BLE001 - collect every case's outcome, then report them together
            failures.append(f"{case}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if "error:" not in line or expected not in line:
            failures.append(f"{case}: {line[:300]}")
    assert not failures, "\n".join(failures)


def test_the_control_a_good_merge_still_writes_the_model(tmp_path, capsys, whole_checkpoint):
    ckpt, model_dir = whole_checkpoint
    assert merge_tool.main([ckpt, str(tmp_path / "out"), "--config-from", model_dir]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("kwargs, expected", [
    ('{"num_cycles": NaN}', "num_cycles=nan is invalid: must be a finite number"),
    ('{"power": Infinity}', "power=inf is invalid: must be a finite number"),
    ('{"lr_end": "x"}', "lr_end='x' is invalid: must be a number"),
    ('{"lr_end": -1}', "lr_end=-1 is invalid: must be >= 0"),
    ('{"min_learning_rate": true}', "min_learning_rate='True' is invalid: must be a number"),
    ('{"warmup": 3}', "unknown key(s) warmup"),
    ("[1]", "JSON object"),
    ("[" * 100000 + "]" * 100000, "invalid JSON object value"),
], ids=["nan_cycles", "inf_power", "text_lr_end", "negative_lr_end", "bool_min_lr", "unknown_key", "a_list", "deep"])
def test_lr_scheduler_kwargs_are_checked_as_the_same_options_on_the_command_line(capsys, tmp_path, kwargs, expected):
    with pytest.raises(SystemExit) as info:
        PdArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--lr_scheduler_kwargs", kwargs], look_for_args_file=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and lines[-1].startswith(f"{os.path.basename(sys.argv[0])}: error: argument "
                                                         "--lr_scheduler_kwargs: ")
    assert expected in lines[-1], lines[-1][:300]


def test_lr_scheduler_kwargs_in_a_json_config_are_checked_too(capsys, tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"output_dir": "%s", "lr_scheduler_kwargs": {"num_cycles": NaN}}' % tmp_path)
    with pytest.raises(SystemExit):
        PdArgumentParser(TrainingArguments).parse_json_file(str(cfg))
    assert "num_cycles=nan is invalid" in capsys.readouterr().err


def loader_child_output(code: str):
    """Run ``code`` (a loader loop that could hang in Paddle's reader thread) in a child with a deadline: its stdout
    lines and the tail of its stderr."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    return proc.stdout.splitlines(), proc.stderr[-2000:]


def test_a_batch_sampler_that_dies_in_the_loader_thread_ends_the_run_with_its_error(tmp_path):
    code = textwrap.dedent("""
        import numpy as np
        import paddle
        from paddletrainer.data.loader import DataLoader

        class LaysOutTooMuch(paddle.io.BatchSampler):
            def __init__(self):
                pass

            def __iter__(self):
                yield [0, 1]
                raise MemoryError("laying out 10**11 samples")

            def __len__(self):
                return 3

        loader = DataLoader([{"x": np.ones(2, "float32")}] * 4, batch_sampler=LaysOutTooMuch())
        try:
            for batch in loader:
                print("batch", list(batch["x"].shape))
        except MemoryError as e:
            print("raised:", e)
    """)
    lines, stderr = loader_child_output(code)
    assert lines == ["batch [2, 2]", "raised: laying out 10**11 samples"], stderr


BAD_SAMPLE_DATASETS = {
    "map": """
        class Samples(paddle.io.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                if i == 2:
                    raise KeyError("sample 2 has no text")
                return {"x": np.ones(2, "float32")}
    """,
    "stream": """
        class Samples(paddle.io.IterableDataset):
            def __iter__(self):
                yield from [{"x": np.ones(2, "float32")}] * 2
                raise KeyError("sample 2 has no text")
    """,
}


@pytest.mark.parametrize("kind", sorted(BAD_SAMPLE_DATASETS))
def test_a_sample_that_raises_in_the_loader_thread_ends_the_run_with_its_error(kind):
    """A data set raising on one sample (map-style ``__getitem__`` or a stream's generator) inside Paddle's
    single-process reader thread: the loop gets the exception instead of waiting forever."""
    code = "import numpy as np\nimport paddle\nfrom paddletrainer.data.loader import DataLoader\n" + textwrap.dedent(
        BAD_SAMPLE_DATASETS[kind]) + textwrap.dedent("""
        try:
            for batch in DataLoader(Samples(), batch_size=2):
                print("batch", list(batch["x"].shape))
        except KeyError as e:
            print("raised:", e)
    """)
    lines, stderr = loader_child_output(code)
    assert lines == ["batch [2, 2]", "raised: 'sample 2 has no text'"], stderr


CONFIG_STRINGS = ["sharding_parallel_config", "pipeline_parallel_config", "tensor_parallel_config",
                  "data_parallel_config", "sequence_parallel_config", "unified_checkpoint_config"]


@pytest.mark.parametrize("option", CONFIG_STRINGS)
def test_bad_config_strings_are_one_short_usage_error_naming_the_option(capsys, tmp_path, option):
    extra = ["--unified_checkpoint", "true"] if option == "unified_checkpoint_config" else []
    for value in ('{"a": 1}', "enable_nothing", "x" * 1000000, " ".join(f"bad{i}" for i in range(10000)), "\x00"):
        with pytest.raises(SystemExit) as info:
            PdArgumentParser(TrainingArguments).parse_args_into_dataclasses(
                ["--output_dir", str(tmp_path), f"--{option}", value, *extra], look_for_args_file=False)
        err = capsys.readouterr().err
        assert info.value.code == 2 and "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert f"error: argument --{option}: {option}: unknown option(s) " in line and len(line) < 1000, line[:300]
