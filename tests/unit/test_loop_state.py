"""The training loop's small state objects in one process: LossTracker (the logged loss and the run's total) and
GracefulStop's start/stop pair (whether a loop still checks the stop flag)."""
import math
import os
import signal
import time

import paddle

from paddletrainer.parallel import init_topology
from paddletrainer.runtime import GracefulStop
from paddletrainer.trainer_loop_state import LossTracker
from paddletrainer.training_args import TrainingArguments


def test_the_loss_tracker_reduces_each_interval_once_and_keeps_the_run_total(tmp_path):
    topology = init_topology(TrainingArguments(output_dir=str(tmp_path)).parallel_config)
    losses = LossTracker()
    for value in (1.0, 2.0, 3.0):
        losses.add(paddle.to_tensor(value))
    assert losses.steps == 3
    assert losses.reduce_and_reset(topology) == 6.0  # one process: the data-group mean is the sum itself
    assert losses.steps == 0 and losses.total == 6.0
    losses.add(paddle.to_tensor(4.0))
    losses.discard()  # a rollback: the unlogged step is neither logged nor in the total
    losses.add(paddle.to_tensor(0.5))
    assert losses.reduce_and_reset(topology) == 0.5 and losses.total == 6.5


def test_the_loss_tracker_counts_a_nonfinite_step_as_the_interval_mean_only_when_asked(tmp_path):
    topology = init_topology(TrainingArguments(output_dir=str(tmp_path)).parallel_config)
    filtered, raw = LossTracker(), LossTracker()
    for value in (2.0, 4.0, float("nan")):
        filtered.add(paddle.to_tensor(value), replace_nonfinite=True)
        raw.add(paddle.to_tensor(value))
    assert filtered.reduce_and_reset(topology) == 9.0  # 2 + 4 + their mean 3
    assert math.isnan(raw.reduce_and_reset(topology))


def test_start_sets_the_check_interval_and_stop_hands_a_signal_to_the_previous_handler():
    calls = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        stop = GracefulStop().install()
        stop.start(every=4)
        assert stop.every == 4 and stop.listening
        stop.stop()  # the loop was left by an error: nobody checks the flag any more
        assert not stop.requested  # stop() asks for no stop
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert calls == [signal.SIGTERM] and not stop.installed and not stop.requested
    finally:
        signal.signal(signal.SIGTERM, old)
