"""The output_dir lock and output_dir itself, and the extras of a PaddleNLP checkpoint, under what a careless user
or a damaged disk leaves: a lock that is a directory, a FIFO, a dangling symlink, names pid 2**70 or carries
another host's heartbeat from the future; an output_dir that is empty, a file, under a file or under /proc; a
``trainer_state.json``, ``scheduler.pdparams`` or ``rng_state.pth`` of the wrong shape, int8 weights for a float
model. Each is one error naming the file (and field) or the option, at once, before anything is applied."""
import json
import os
import random
import socket
import time

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.output_lock import LOCK_NAME, OutputDirLock
from paddletrainer.checkpoint.paddlenlp_interop import load_paddlenlp_checkpoint
from paddletrainer.training_args import TrainingArguments
from deadline import within


def lock_json(**fields):
    holder = {"format": "paddletrainer-output-lock", "host": socket.gethostname(), "pid": 1, "process_start": None,
              "started": "2026-01-01T00:00:00+00:00", "run_id": "x" * 32, "job_id": None, "output_dir": "/x"}
    return json.dumps({**holder, **fields})


def special_lock(tmp_path, case):
    lock = tmp_path / LOCK_NAME
    if case == "directory":
        lock.mkdir()
    elif case == "fifo":
        os.mkfifo(lock)
    elif case == "dangling_symlink":
        os.symlink(tmp_path / "gone", lock)
    elif case == "pid_2_70":
        lock.write_text(lock_json(pid=2**70))
    return {"directory": "a directory", "fifo": "not a regular file",
            "dangling_symlink": "a symlink to", "pid_2_70": "field pid=1180591620717411303424"}[case]


@pytest.mark.parametrize("case", ["directory", "fifo", "dangling_symlink", "pid_2_70"])
def test_a_lock_file_that_no_run_writes_is_refused_at_once_naming_it(tmp_path, case):
    expected = special_lock(tmp_path, case)
    with within(5), pytest.raises(CheckpointError) as info:
        OutputDirLock(str(tmp_path)).acquire()
    message = str(info.value)
    assert message.startswith(f"{tmp_path / LOCK_NAME} is not a paddletrainer lock file ({expected}")
    assert "delete it if no run is using" in message


def test_another_host_s_lock_with_a_heartbeat_from_the_future_is_stale(tmp_path, caplog):
    lock = tmp_path / LOCK_NAME
    lock.write_text(lock_json(host="another-host", pid=4242))
    future = time.time() + 10 * 3600  # no renewal writes this: the filesystem's "now" is what a heartbeat sets
    os.utime(lock, (future, future))
    with caplog.at_level("WARNING"):
        held = OutputDirLock(str(tmp_path)).acquire()
    try:
        assert "has a heartbeat" in caplog.text and "in the future" in caplog.text
        assert json.loads(lock.read_text())["run_id"] == held.run_id
    finally:
        held.release()


def test_the_control_another_host_s_fresh_lock_is_still_refused(tmp_path):
    (tmp_path / LOCK_NAME).write_text(lock_json(host="another-host", pid=4242))
    with pytest.raises(CheckpointError, match="is in use by another training run"):
        OutputDirLock(str(tmp_path)).acquire()


@pytest.mark.parametrize("case", ["empty", "a_file", "under_a_file"])
def test_an_output_dir_that_cannot_be_a_directory_is_refused_with_the_arguments(tmp_path, case):
    (tmp_path / "f").write_text("x")
    output_dir = {"empty": "", "a_file": str(tmp_path / "f"), "under_a_file": str(tmp_path / "f" / "run")}[case]
    expected = {"empty": "must name a directory", "a_file": "it is a file, not a directory",
                "under_a_file": "which is a file, not a directory"}[case]
    with pytest.raises(ValueError, match=f"^output_dir={output_dir!r} is invalid: .*{expected}"):
        TrainingArguments(output_dir=output_dir)


@pytest.mark.parametrize("output_dir, expected", [("/proc/paddletrainer-run", "cannot be created"),
                                                  ("/proc", "is not writable: writing its lock file failed")])
def test_an_output_dir_that_cannot_be_created_or_written_is_one_error_naming_it(output_dir, expected):
    with pytest.raises(CheckpointError, match=f"^output_dir='{output_dir}' {expected}"):
        OutputDirLock(output_dir).acquire()


@pytest.fixture
def nlp_checkpoint(tmp_path):
    """A PaddleNLP non-unified checkpoint of ``nn.Linear(2, 3)``: weights, scheduler, RNG, trainer state."""
    paddle.seed(3)
    model = paddle.nn.Linear(2, 3)
    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    paddle.save(model.state_dict(), str(ckpt / "model_state.pdparams"))
    paddle.save({"last_epoch": 2, "last_lr": 0.1}, str(ckpt / "scheduler.pdparams"))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    return str(ckpt)


def load(ckpt, **kw):
    scheduler = paddle.optimizer.lr.LinearWarmup(0.1, 4, 0.0, 0.1)
    return load_paddlenlp_checkpoint(ckpt, model=paddle.nn.Linear(2, 3), lr_scheduler=scheduler, **kw), scheduler


def test_the_control_a_paddlenlp_checkpoint_s_extras_load(nlp_checkpoint):
    tracker = {"model_parallel_rng": paddle.get_rng_state()}  # as PaddleNLP saves fleet's tracker
    paddle.save({**RNG, "hybrid_parallel_rng_state_tracker": tracker}, os.path.join(nlp_checkpoint, "rng_state.pth"))
    loaded, scheduler = load(nlp_checkpoint)
    assert loaded.trainer_state["global_step"] == 2 and scheduler.last_epoch == 2 and loaded.rng_restored


RNG = {"python": random.getstate(), "numpy": np.random.get_state(),
       "cpu": paddle.framework.core.default_cpu_generator().get_state()}
BAD_EXTRAS = {  # case: (file, what it holds, the field the error names)
    "trainer_state_step_text": ("trainer_state.json", '{"global_step": "2"}', "global_step"),
    "trainer_state_a_list": ("trainer_state.json", "[2]", "trainer_state.json"),
    "trainer_state_nan_epoch": ("trainer_state.json", '{"global_step": 2, "epoch": NaN}', "epoch"),
    "scheduler_lr_text": ("scheduler.pdparams", {"last_epoch": 2, "last_lr": "x"}, "last_lr"),
    "scheduler_a_list": ("scheduler.pdparams", [2], "not a state dict"),
    "rng_python_text": ("rng_state.pth", {"python": "x", "numpy": np.random.get_state(),
                                          "cpu": paddle.framework.core.default_cpu_generator().get_state()}, "python"),
    "rng_tracker_a_number": ("rng_state.pth", {**RNG, "hybrid_parallel_rng_state_tracker": {"model_parallel_rng": 1}},
                             "hybrid_parallel_rng_state_tracker"),
    "rng_no_numpy": ("rng_state.pth", {"python": random.getstate(),
                                       "cpu": paddle.framework.core.default_cpu_generator().get_state()}, "numpy"),
}


@pytest.mark.parametrize("case", sorted(BAD_EXTRAS))
def test_a_paddlenlp_extra_of_the_wrong_shape_is_refused_naming_file_and_field_before_anything_is_applied(
        nlp_checkpoint, case):
    name, content, field = BAD_EXTRAS[case]
    path = os.path.join(nlp_checkpoint, name)
    if isinstance(content, str):
        with open(path, "w") as f:
            f.write(content)
    else:
        paddle.save(content, path)
    python_state = random.getstate()
    with pytest.raises(CheckpointError) as info:
        load(nlp_checkpoint)
    assert str(info.value).startswith(path) and field in str(info.value), str(info.value)
    assert random.getstate() == python_state


def test_a_fifo_as_trainer_state_is_refused_at_once(nlp_checkpoint):
    os.remove(os.path.join(nlp_checkpoint, "trainer_state.json"))
    os.mkfifo(os.path.join(nlp_checkpoint, "trainer_state.json"))
    with within(5), pytest.raises(CheckpointError, match="trainer_state.json: is a FIFO, not a regular file"):
        load(nlp_checkpoint)


def test_int8_weights_for_a_float_model_are_refused_not_cast(nlp_checkpoint):
    paddle.save({"weight": paddle.to_tensor(np.ones((2, 3), "int8")), "bias": paddle.zeros([3])},
                os.path.join(nlp_checkpoint, "model_state.pdparams"))
    with pytest.raises(CheckpointError, match=r"weight: dtype int8 in the checkpoint but float32 in the model"):
        load(nlp_checkpoint)
