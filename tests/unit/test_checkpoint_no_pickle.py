"""Loading a checkpoint never runs code from it: the RNG state is JSON, and a pickle planted in any file of one
of our checkpoints — with an index whose size and crc32 match it — is refused (or, for an older checkpoint's
pickled RNG file, skipped with a warning), never unpickled."""
import collections
import json
import logging
import os
import pickle
import random
import zlib

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import CheckpointError, placement as L, load_checkpoint, save_checkpoint
from paddletrainer.checkpoint import rng as rng_mod
from paddletrainer.parallel.layout import Layout
from paddletrainer.checkpoint.read import UnsafeCheckpointFileError
from toy_models import RegressionModel, regression_data


class _CreatesFile:
    """Unpickling this runs ``open(path, "w")``: a harmless stand-in for arbitrary code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def payload(path) -> bytes:
    return pickle.dumps(_CreatesFile(str(path)))


def test_the_payload_really_runs_when_unpickled(tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(payload(marker))  # the control: without it the tests below could pass with a dud payload
    assert marker.exists()


def args_for(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=0.1, max_steps=4,
                logging_steps=1, save_strategy="steps", save_steps=2, evaluation_strategy="no", disable_tqdm=True,
                report_to="none", seed=42, weight_decay=0.0)
    base.update(kw)
    return TrainingArguments(**base)


@pytest.fixture
def trained(tmp_path):
    """A finished 4-step run with checkpoints at steps 2 and 4; returns checkpoint-2's path."""
    Trainer(model=RegressionModel(), args=args_for(tmp_path), train_dataset=regression_data()).train()
    return str(tmp_path / "out" / "checkpoint-2")


def plant(ckpt, name, data, rename_from=None):
    """Write ``data`` as file ``name`` and make the index agree with it (size + crc32), as an attacker would."""
    index_path = os.path.join(ckpt, L.INDEX_NAME)
    index = json.load(open(index_path))
    if rename_from is not None:
        os.remove(os.path.join(ckpt, rename_from))
        del index["files"][rename_from]
    with open(os.path.join(ckpt, name), "wb") as f:
        f.write(data)
    index["files"][name] = {"size": len(data), "crc32": zlib.crc32(data)}
    with open(index_path, "w") as f:
        json.dump(index, f)


def rng_name():
    return L.rng_file_name(Layout(world_size=1).cell_name({}))


@pytest.mark.parametrize("target", ["rng", "trainer_state", "scheduler", "model"])
def test_a_pickle_planted_in_a_checkpoint_is_neither_run_nor_loaded_on_resume(tmp_path, trained, target):
    name = {"rng": rng_name(), "trainer_state": L.TRAINER_STATE_NAME, "scheduler": L.SCHEDULER_NAME,
            "model": L.model_file_name(0, 0)}[target]
    assert os.path.isfile(os.path.join(trained, name)), os.listdir(trained)
    marker = tmp_path / "pwned"
    plant(trained, name, payload(marker))
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, overwrite_output_dir=True),
                      train_dataset=regression_data())
    with pytest.raises(Exception) as info:
        trainer.train(resume_from_checkpoint=trained)
    assert not marker.exists(), "loading the checkpoint ran the pickle"
    if target != "model":  # safetensors' own parser refuses a file that is not safetensors
        assert isinstance(info.value, UnsafeCheckpointFileError), info.value
        assert name in str(info.value) and "pickle" in str(info.value)
    assert trainer.state.global_step == 0  # nothing of the checkpoint was taken


def test_an_older_checkpoint_with_a_pickled_rng_state_resumes_without_rng_and_warns(tmp_path, trained, caplog):
    marker = tmp_path / "pwned"
    legacy = L.legacy_rng_file_name(Layout(world_size=1).cell_name({}))
    plant(trained, legacy, payload(marker), rename_from=rng_name())
    model = RegressionModel()
    with caplog.at_level(logging.WARNING):
        loaded = load_checkpoint(trained, model=model)
    assert not marker.exists(), "the legacy RNG pickle was unpickled"
    assert not loaded.rng_restored
    assert any(legacy in w and "never loaded" in w for w in loaded.warnings), loaded.warnings
    # and the Trainer resumes from it to the end
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, overwrite_output_dir=True),
                      train_dataset=regression_data())
    trainer.train(resume_from_checkpoint=trained)
    assert trainer.state.global_step == 4 and not marker.exists()


def test_rng_state_is_stored_as_json_and_restores_python_numpy_paddle_and_the_tracker(tmp_path):
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    tracker = get_rng_state_tracker()
    if "test_stream" not in tracker.states_:
        tracker.add("test_stream", 4242)
    random.seed(1), np.random.seed(1), paddle.seed(1)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    model = paddle.nn.Linear(2, 2)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    raw = open(os.path.join(ckpt, rng_name()), "rb").read()
    doc = json.loads(raw)  # plain JSON, no pickle anywhere in the checkpoint
    assert doc["format"] == rng_mod.FORMAT and "test_stream" in doc["tracker"]
    assert not any(n.endswith(".pkl") for n in os.listdir(ckpt))

    def draw():
        with tracker.rng_state("test_stream"):
            t = paddle.rand([3]).numpy()
        return random.random(), np.random.randn(), paddle.rand([3]).numpy().tolist(), t.tolist()

    expected = draw()
    load_checkpoint(ckpt, model=model)
    assert draw() == expected


@pytest.mark.parametrize("data,error", [
    (pickle.dumps({"python": 1}, protocol=0), UnsafeCheckpointFileError),
    (pickle.dumps({"python": 1}), UnsafeCheckpointFileError),
    (b'{"format": "something-else"}', CheckpointError),
    (b'{"format": "paddletrainer-rng/1", "python": {"version": "3"}}', CheckpointError),
])
def test_rng_loads_refuses_pickles_and_foreign_json(data, error):
    with pytest.raises(error):
        rng_mod.loads(data, source="x")


def plant_paddlenlp_files(ckpt_dir, marker, step):
    """Make ``ckpt_dir`` look like a PaddleNLP checkpoint whose weights file is a pickle payload."""
    os.makedirs(ckpt_dir, exist_ok=True)
    with open(os.path.join(ckpt_dir, "model_state.pdparams"), "wb") as f:
        f.write(payload(marker))
    with open(os.path.join(ckpt_dir, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)


@pytest.mark.parametrize("resume", ["auto", "true"])
def test_pdparams_planted_beside_our_marker_never_reach_the_pickle_reader(tmp_path, trained, resume):
    # checkpoint-4 keeps our completion marker but loses its index and gains a pickled model_state.pdparams:
    # it must still be read as ours (and refused), not routed to the PaddleNLP interop loader.
    newest = str(tmp_path / "out" / "checkpoint-4")
    os.remove(os.path.join(newest, L.INDEX_NAME))
    marker = tmp_path / "pwned"
    plant_paddlenlp_files(newest, marker, step=4)
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, overwrite_output_dir=True, max_steps=6),
                      train_dataset=regression_data())
    if resume == "auto":
        # auto passes over the damaged checkpoint-4 (no index) to checkpoint-2; that run would save step 4 onto a
        # directory that is no longer a checkpoint of ours, so it is refused before training, naming it
        with pytest.raises(ValueError, match="checkpoint-4"):
            trainer.train(resume_from_checkpoint=resume)
    else:
        with pytest.raises(Exception):
            trainer.train(resume_from_checkpoint=resume)
    assert not marker.exists(), f"resume_from_checkpoint={resume} unpickled a planted .pdparams"


def test_true_prefers_our_checkpoints_to_a_newer_looking_paddlenlp_directory(tmp_path, trained):
    from paddletrainer.trainer_utils import get_last_checkpoint

    marker = tmp_path / "pwned"
    plant_paddlenlp_files(str(tmp_path / "out" / "checkpoint-999999"), marker, step=999999)
    assert get_last_checkpoint(str(tmp_path / "out")) == str(tmp_path / "out" / "checkpoint-4")
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, overwrite_output_dir=True, max_steps=6),
                      train_dataset=regression_data())
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6 and not marker.exists()


def test_resuming_a_checkpoint_outside_output_dir_leaves_the_tmp_dirs_beside_it_alone(tmp_path, trained):
    # another job may be saving next to the checkpoint we resume from: its in-flight dir must survive
    in_flight = tmp_path / "out" / "checkpoint-6.tmp-otherjob"
    in_flight.mkdir()
    args = args_for(tmp_path, output_dir=str(tmp_path / "elsewhere"), max_steps=4)
    Trainer(model=RegressionModel(), args=args, train_dataset=regression_data()).train(resume_from_checkpoint=trained)
    assert in_flight.is_dir()


# ------------------------------------------------- PaddleNLP checkpoints: pickles read only from a path the user names
def best_model_args(tmp_path, **kw):
    return args_for(tmp_path, evaluation_strategy="steps", eval_steps=1, save_steps=1, load_best_model_at_end=True,
                    metric_for_best_model="loss", **kw)


def test_a_best_model_checkpoint_named_by_a_resumed_trainer_state_is_never_unpickled(tmp_path, caplog):
    out = tmp_path / "out"
    Trainer(model=RegressionModel(), args=best_model_args(tmp_path, max_steps=2), train_dataset=regression_data(),
            eval_dataset=regression_data(8)).train()
    marker, evil = tmp_path / "pwned", str(tmp_path / "elsewhere" / "checkpoint-1")
    plant_paddlenlp_files(evil, marker, step=1)
    newest = str(out / "checkpoint-2")
    state = json.load(open(os.path.join(newest, L.TRAINER_STATE_NAME)))
    state.update(best_model_checkpoint=evil, best_metric=-1.0)  # no eval loss beats it: it stays the best
    plant(newest, L.TRAINER_STATE_NAME, json.dumps(state).encode())
    trainer = Trainer(model=RegressionModel(), train_dataset=regression_data(), eval_dataset=regression_data(8),
                      args=best_model_args(tmp_path, max_steps=3, resume_from_checkpoint="auto"))
    with caplog.at_level(logging.WARNING, logger="paddletrainer.trainer"):
        trainer.train()
    assert not marker.exists(), "load_best_model_at_end unpickled the directory a trainer_state.json named"
    assert trainer.state.global_step == 3 and trainer.state.best_model_checkpoint == evil
    assert any("load_best_model_at_end" in r.getMessage() and evil in r.getMessage() for r in caplog.records)


def test_resume_true_never_picks_a_paddlenlp_checkpoint_it_finds(tmp_path):
    marker, found = tmp_path / "pwned", str(tmp_path / "out" / "checkpoint-5")
    plant_paddlenlp_files(found, marker, step=5)  # output_dir holds no checkpoint of ours
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6), train_dataset=regression_data())
    with pytest.raises(ValueError, match=rf"only PaddleNLP's checkpoint-5.*--resume_from_checkpoint {found}"):
        trainer.train(resume_from_checkpoint=True)
    assert not marker.exists()
    with pytest.raises(ValueError, match="only PaddleNLP's checkpoint-5"):  # a usage error from the options too
        args_for(tmp_path, resume_from_checkpoint="true")
    assert not marker.exists()


def test_a_named_paddlenlp_checkpoint_with_a_code_payload_is_refused_naming_the_file_and_the_class(tmp_path):
    marker, named = tmp_path / "pwned", str(tmp_path / "theirs" / "checkpoint-3")
    plant_paddlenlp_files(named, marker, step=3)
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path), train_dataset=regression_data())
    with pytest.raises(UnsafeCheckpointFileError) as info:
        trainer.train(resume_from_checkpoint=named)
    assert not marker.exists(), "the allowlist unpickler ran the payload"
    message = str(info.value)
    assert os.path.join(named, "model_state.pdparams") in message and f"{open.__module__}.{open.__qualname__}" in message
    assert trainer.state.global_step == 0


class _Evaluates:
    """Unpickles as ``eval(<code>)``: the name paddle.save uses for DenseTensors, put to another use."""

    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


@pytest.mark.parametrize("case", ["eval_code", "object_array", "os_system"])
def test_the_allowlist_unpickler_refuses_what_paddle_save_never_writes(tmp_path, case):
    from paddletrainer.checkpoint.restricted_pickle import load_pickle

    marker = tmp_path / "pwned"
    obj, named = {
        "eval_code": (_Evaluates(f"open({str(marker)!r}, 'w')"), "builtins.eval"),
        "object_array": (np.array([1, "a"], dtype=object), "dtype object"),
        "os_system": (_CreatesFile(str(marker)), f"{open.__module__}.{open.__qualname__}"),
    }[case]
    path = tmp_path / "x.pdparams"
    path.write_bytes(pickle.dumps({"w": obj}))
    with pytest.raises(UnsafeCheckpointFileError, match=str(path)) as info:
        load_pickle(str(path))
    assert named in str(info.value) and not marker.exists()


def _same(ours, theirs, where="$"):
    assert type(ours) is type(theirs), where
    if isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            _same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(ours, paddle.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        if not theirs.name.startswith("generated_tensor"):  # an unnamed tensor gets a fresh name on each load
            assert ours.name == theirs.name, where
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    elif isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype, where
        np.testing.assert_array_equal(ours, theirs)
    elif isinstance(ours, paddle.framework.core.GeneratorState):
        assert ours.__getstate__() == theirs.__getstate__(), where
    else:
        assert ours == theirs, where


def test_the_allowlist_unpickler_returns_what_paddle_load_returns_for_a_real_paddlenlp_checkpoint(tmp_path):
    paddlenlp_trainer = pytest.importorskip("paddlenlp.trainer")
    from paddletrainer.checkpoint.restricted_pickle import load_pickle

    with paddle.utils.unique_name.guard():
        args = paddlenlp_trainer.TrainingArguments(output_dir=str(tmp_path / "nlp"), max_steps=2, save_steps=2,
                                                   per_device_train_batch_size=4, report_to="none", disable_tqdm=True)
        paddlenlp_trainer.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16)).train()
    ckpt = tmp_path / "nlp" / "checkpoint-2"
    files = sorted(p for p in ckpt.iterdir() if p.suffix in (".pdparams", ".pdopt", ".pth"))
    assert {p.name for p in files} >= {"model_state.pdparams", "optimizer.pdopt", "scheduler.pdparams", "rng_state.pth"}
    for path in files:  # rng_state.pth: paddle.load itself fails without return_numpy (uint32 arrays)
        for return_numpy in (True,) if path.suffix == ".pth" else (False, True):
            _same(load_pickle(str(path), return_numpy=return_numpy), paddle.load(str(path), return_numpy=return_numpy))
    # what paddle.save writes beyond a flat state dict: tensors nested in containers (pickled as (name, array)
    # tuples, e.g. an optimizer's master_weights) and DenseTensors (pickled through eval), under protocols 2-4
    weight = paddle.to_tensor([1.0, 2.0])
    weight.name = "w0"
    nested = {"master_weights": {"w0": weight}, "x": [weight, 3, "s", (1, 2.5)],
              "od": collections.OrderedDict(a=np.float32(2))}
    for obj in (nested, [weight.value().get_tensor(), {"step": 1}]):
        for protocol in (2, 3, 4):
            paddle.save(obj, str(tmp_path / "obj.pd"), protocol=protocol)
            for return_numpy in (False, True):
                _same(load_pickle(str(tmp_path / "obj.pd"), return_numpy=return_numpy),
                      paddle.load(str(tmp_path / "obj.pd"), return_numpy=return_numpy))
