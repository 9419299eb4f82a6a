"""PaddleNLP 3.0.0b4's public names of ``trainer.trainer_utils`` and ``trainer.utils.helper`` at the same paths here:
each is called with the same inputs as PaddleNLP's and gives the same result (skipped without paddlenlp)."""
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddletrainer import trainer_utils
from paddletrainer.utils import helper

nlp_utils = pytest.importorskip("paddlenlp.trainer.trainer_utils")
nlp_helper = pytest.importorskip("paddlenlp.trainer.utils.helper")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULES = [
    ("get_constant_schedule", {}),
    ("get_constant_schedule_with_warmup", {"num_warmup_steps": 4}),
    ("get_linear_schedule_with_warmup", {"num_warmup_steps": 4, "num_training_steps": 15}),
    ("get_cosine_schedule_with_warmup", {"num_warmup_steps": 3, "num_training_steps": 20, "num_cycles": 1.5}),
    ("get_polynomial_decay_schedule_with_warmup",
     {"num_warmup_steps": 2, "num_training_steps": 15, "lr_end": 0.01, "power": 2.0}),
]


def lrs(schedule, steps=20):
    out = []
    for _ in range(steps):
        out.append(schedule.get_lr())
        schedule.step()
    return out


@pytest.mark.parametrize("name,kwargs", SCHEDULES)
def test_each_schedule_constructor_gives_paddlenlps_learning_rates(name, kwargs):
    ours, theirs = getattr(trainer_utils, name), getattr(nlp_utils, name)
    np.testing.assert_allclose(lrs(ours(0.5, **kwargs)), lrs(theirs(0.5, **kwargs)), rtol=1e-12)
    resumed = dict(kwargs, last_epoch=6)  # rebuilt at a step: the same curve from there
    np.testing.assert_allclose(lrs(ours(0.5, **resumed), 10), lrs(theirs(0.5, **resumed), 10), rtol=1e-12)


@pytest.mark.parametrize("name", ["linear", "cosine", "constant", "constant_with_warmup", "polynomial"])
def test_get_scheduler_gives_paddlenlps_learning_rates_and_needs_the_same_arguments(name):
    kwargs = {"num_warmup_steps": 3, "num_training_steps": 20, "power": 1.5}
    np.testing.assert_allclose(lrs(trainer_utils.get_scheduler(name, 0.1, **kwargs)),
                               lrs(nlp_utils.get_scheduler(name, 0.1, **kwargs)), rtol=1e-12)
    for missing in ("num_warmup_steps", "num_training_steps"):
        partial_kwargs = {k: v for k, v in kwargs.items() if k != missing}
        try:
            nlp_utils.get_scheduler(name, 0.1, **partial_kwargs)
        except ValueError:
            with pytest.raises(ValueError, match=missing):
                trainer_utils.get_scheduler(name, 0.1, **partial_kwargs)
        else:
            trainer_utils.get_scheduler(name, 0.1, **partial_kwargs)


def test_the_pure_helpers_agree_with_paddlenlps(monkeypatch):
    for rank in (-1, 0, 1, 3):
        assert trainer_utils.is_main_process(rank) == nlp_utils.is_main_process(rank)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")  # what paddle.distributed.get_world_size() reads unlaunched
    for rank in (-1, 0):
        assert trainer_utils.total_processes_number(rank) == nlp_utils.total_processes_number(rank)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    assert trainer_utils.total_processes_number(2) == 4 and trainer_utils.total_processes_number(-1) == 1
    intervals = [[3, 5], [9, 9]]
    for step in range(12):
        assert trainer_utils.should_skip_data(step, intervals) == nlp_utils.should_skip_data(step, intervals)
    assert trainer_utils.should_skip_data(4, None) is nlp_utils.should_skip_data(4, None) is False
    for bad in ([[5, 3]], [[0, 2]], [[1, 2, 3]]):
        with pytest.raises(ValueError):
            nlp_utils.should_skip_data(1, bad)
        with pytest.raises(ValueError, match="skip_data_intervals"):
            trainer_utils.should_skip_data(1, bad)
    for text in ("enable_dp_comm_overlap,enable_release_grads", "a b  c", "", "single"):
        assert trainer_utils.split_parallel_config(text) == nlp_utils.split_parallel_config(text)
    assert trainer_utils.EvaluationStrategy("steps") == nlp_utils.EvaluationStrategy("steps").value == "steps"
    assert [m.value for m in trainer_utils.EvaluationStrategy] == [m.value for m in nlp_utils.EvaluationStrategy]


def test_log_trainer_start_logs_once_per_process_tree(monkeypatch, caplog):
    monkeypatch.delenv("MAIN_PROCESS_STARTED", raising=False)
    with caplog.at_level(logging.INFO, logger="paddletrainer.trainer"):
        trainer_utils.log_trainer_start()
        trainer_utils.log_trainer_start()
    started = [r for r in caplog.records if "The Training Main Process Started Successfully" in r.getMessage()]
    assert len(started) == 1 and f"pid: {os.getpid()}" in started[0].getMessage()
    assert os.environ["MAIN_PROCESS_STARTED"] == "1"


def test_download_recovery_ckpt_from_pdc_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="download_recovery_ckpt_from_pdc.*resume_from_checkpoint"):
        trainer_utils.download_recovery_ckpt_from_pdc("out/checkpoint-5", 60)


def test_set_hyrbid_parallel_seed_seeds_like_paddlenlp():
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    tracker = get_rng_state_tracker()
    draws = []
    for fn in (nlp_utils.set_hyrbid_parallel_seed, trainer_utils.set_hyrbid_parallel_seed):
        tracker.reset()
        fn(11, dataset_rank=2, tp_rank=1, pp_rank=3)
        draws.append((np.random.rand(), paddle.rand([2]).numpy().tolist(), sorted(tracker.states_),
                      sorted(tracker.seeds_)))
    assert draws[0] == draws[1]
    assert sorted(tracker.seeds_) == [11 + 59999 + 10 + 3000, 11 + 100003 + 2]
    tracker.reset()


class FakeTrainer:
    """What PaddleNLP's trainer_utils functions of ``self`` read: its arguments, state and rank."""

    def __init__(self, output_dir):
        from paddletrainer.trainer_callback import TrainerState

        self.args = SimpleNamespace(output_dir=str(output_dir), should_log=True, should_save=True)
        self.state = TrainerState(global_step=7)

    def is_world_process_zero(self):
        return True

    def metrics_format(self, metrics):
        return trainer_utils.metrics_format(self, metrics)


def test_metrics_functions_of_a_trainer_give_paddlenlps_display_and_files(tmp_path, capsys, caplog):
    metrics = {"train_runtime": 93784.567, "eval_runtime": 3.5, "train_mem_cpu_alloc_delta": 5 * 2**20 + 7,
               "total_flos": 3 * 2**30 + 5.0, "loss": 0.123456789, "epoch": 2}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    assert trainer_utils.metrics_format(None, metrics) == nlp_utils.metrics_format(None, metrics)
    with caplog.at_level(logging.INFO):
        nlp_utils.log_metrics(FakeTrainer(theirs), "train", metrics)
    trainer_utils.log_metrics(FakeTrainer(ours), "train", metrics)
    printed = capsys.readouterr().out.splitlines()
    logged = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage() or " = " in r.getMessage()]
    assert printed == logged[-len(printed):] and len(printed) == len(metrics) + 1
    for fn, where in ((trainer_utils, ours), (nlp_utils, theirs)):
        fn.save_metrics(FakeTrainer(where), "train", metrics)
        fn.save_metrics(FakeTrainer(where), "eval", {"eval_loss": 0.5})
        fn.save_state(FakeTrainer(where))
    for name in ("train_results.json", "eval_results.json", "all_results.json", "trainer_state.json"):
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text()), name


STREAM_CASES = [(2, False, 2), (2, True, 2), (3, False, 4), (3, True, 4), (1, False, 3), (4, False, 3), (5, True, 1)]


@pytest.mark.parametrize("batch,drop_last,processes", STREAM_CASES)
@pytest.mark.parametrize("length", [12, 13, 5])
def test_iterable_dataset_shard_yields_paddlenlps_items_per_process(batch, drop_last, processes, length):
    class Stream(paddle.io.IterableDataset):
        def __init__(self):
            self.epochs = []

        def __iter__(self):
            return iter(range(length))

        def __len__(self):
            return length

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    for rank in range(processes):
        kwargs = dict(batch_size=batch, drop_last=drop_last, num_processes=processes, process_index=rank, seed=3)
        ours, theirs = trainer_utils.IterableDatasetShard(Stream(), **kwargs), nlp_utils.IterableDatasetShard(
            Stream(), **kwargs)
        assert list(ours) == list(theirs) and ours.num_examples == theirs.num_examples
        assert len(ours) == len(theirs)
        ours.set_epoch(4)
        assert ours.epoch == 4 and ours.dataset.epochs == [4]


@pytest.mark.parametrize("length,batch,nranks,shuffle", [(10, 3, 2, False), (10, 3, 2, True), (7, 4, 3, False),
                                                         (12, 2, 3, True), (2, 4, 2, False), (9, 3, 1, True)])
def test_last_batch_padding_sampler_gives_paddlenlps_batches(length, batch, nranks, shuffle):
    data = list(range(length))
    for rank in range(nranks):
        kwargs = dict(batch_size=batch, num_replicas=nranks, rank=rank, shuffle=shuffle)
        ours, theirs = trainer_utils.LastBatchPaddingSampler(data, **kwargs), nlp_utils.LastBatchPaddingSampler(
            data, **kwargs)
        for _ in range(2):  # two epochs: the shuffle advances
            assert list(ours) == list(theirs)
        assert (ours.total_size, ours.epoch, len(ours)) == (theirs.total_size, theirs.epoch, len(theirs))


def test_last_batch_padding_sampler_refuses_a_partial_accumulated_batch():
    sampler = trainer_utils.LastBatchPaddingSampler(list(range(5)), batch_size=2, num_replicas=1, rank=0)
    sampler._acc_steps = 2  # auto-parallel's accumulation: 6 padded samples are 1.5 batches of 4
    with pytest.raises(ValueError, match="6 samples are not a whole number of batches of 4"):
        list(sampler)


def test_remove_columns_collator_filters_features_and_logs_like_paddlenlp(caplog):
    features = [{"input_ids": [1, 2], "labels": 0, "text": "a"}, {"input_ids": [3, 4], "labels": 1, "text": "b"}, 5]
    seen = []

    def collate(batch):
        seen.append(batch)
        return len(batch)

    log = logging.getLogger("test-remove-columns")
    for cls in (trainer_utils.RemoveColumnsCollator, nlp_utils.RemoveColumnsCollator):
        collator = cls(collate, ["input_ids", "labels"], logger=log, model_name="Toy", description="training")
        with caplog.at_level(logging.INFO, logger="test-remove-columns"):
            assert collator(features) == 3 and collator(features) == 3
    assert seen[0] == seen[1] == seen[2] == seen[3] == [{"input_ids": [1, 2], "labels": 0},
                                                        {"input_ids": [3, 4], "labels": 1}, 5]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("ignored: text" in m and "in the training set" in m for m in messages)


def test_trainer_memory_tracker_reports_paddlenlps_stage_keys():
    class Owner:
        def __init__(self, tracker):
            self.tracker = tracker
            tracker.start()
            tracker.stop_and_update_metrics()

        def evaluate(self):
            self.tracker.start()
            _ = bytearray(8 << 20)
            metrics = {}
            self.tracker.stop_and_update_metrics(metrics)
            return metrics

        def predict(self):
            self.tracker.start()
            metrics = {}
            self.tracker.stop_and_update_metrics(metrics)
            return metrics

    owner = Owner(trainer_utils.TrainerMemoryTracker(skip_memory_metrics=False))
    first, second = owner.evaluate(), owner.predict()
    expected_first = {f"{s}_mem_cpu_{t}_delta" for s in ("init", "eval") for t in ("alloc", "peaked")}
    assert expected_first <= set(first) and {"test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"} <= set(second)
    assert not any(k.startswith("init_") for k in second)
    skipped = Owner(trainer_utils.TrainerMemoryTracker(skip_memory_metrics=True))
    assert skipped.evaluate() == {}
    with pytest.raises(ValueError, match="called from test_trainer_memory"):
        trainer_utils.TrainerMemoryTracker().start()


@pytest.mark.parametrize("first,second", [((3, 4), (2, 4)), ((2, 3), (2, 5)), ((3,), (2,)), ((2, 5, 2), (1, 3, 2))])
def test_pad_and_concatenate_equal_paddlenlps(first, second):
    rng = np.random.RandomState(0)
    a, b = rng.randint(0, 9, first).astype("int64"), rng.randint(0, 9, second).astype("int64")
    np.testing.assert_array_equal(helper.numpy_pad_and_concatenate(a, b, padding_index=-7),
                                  nlp_helper.numpy_pad_and_concatenate(a, b, padding_index=-7))
    ours = helper.paddle_pad_and_concatenate(paddle.to_tensor(a), paddle.to_tensor(b))
    theirs = nlp_helper.paddle_pad_and_concatenate(paddle.to_tensor(a), paddle.to_tensor(b))
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_trainer_utils_imports_without_paddle_and_lists_every_name():
    code = ("import sys; sys.modules['paddle'] = None\n"
            "from paddletrainer import trainer_utils as t\n"
            "assert set(t.__all__) <= set(dir(t)), sorted(set(t.__all__) - set(dir(t)))\n"
            "print(t.EvaluationStrategy.EPOCH, t.should_skip_data(0, [[1, 1]]))\n")
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["epoch", "True"]
    for name in trainer_utils.__all__:  # with paddle: each one resolves
        assert getattr(trainer_utils, name) is not None, name
