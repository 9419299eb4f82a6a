"""One process through the public Trainer: an optimizer step that does not log reads no tensor value on the host
(``Tensor.numpy``/``item``/``float``/``bool``/...), with gradient accumulation, clipping, the linear LR schedule
and the default ``nan_inf_policy``; the logging steps do read (so the counter sees reads when there are some).
The pp2 launch is tests/distributed/test_pp2_no_host_reads_between_logging_steps.py."""
import numpy as np
import pytest

from host_reads import HostReadCounter
from paddletrainer import Trainer, TrainingArguments
from paddletrainer.errors import NonFiniteLossError
from toy_models import RegressionModel, poisonable, regression_data

MAX_STEPS, LOGGING_STEPS = 12, 4


def run(out, counter, model=None, **kw):
    args = dict(output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.1,
                max_steps=MAX_STEPS, logging_steps=LOGGING_STEPS, save_steps=100, max_grad_norm=0.5,
                lr_scheduler_type="linear", warmup_steps=2, disable_tqdm=True, report_to="none", seed=1)
    args.update(kw)
    trainer = Trainer(model=model or RegressionModel(), args=TrainingArguments(**args),
                      train_dataset=regression_data(128), callbacks=[counter])
    counter.install()
    try:
        trainer.train()
    finally:
        counter.uninstall()
    return trainer


def test_steps_between_logging_steps_read_nothing_on_the_host_and_logging_steps_do(tmp_path):
    counter = HostReadCounter()
    trainer = run(tmp_path, counter)
    assert counter.logged_steps == {4, 8, 12}
    assert counter.reads_outside_logging_steps(MAX_STEPS) == {}
    assert all(counter.reads[s] for s in counter.logged_steps)  # the loss, lr and grad norm are read there
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(np.isfinite(h["grad_norm"]) and np.isfinite(h["loss"]) for h in logs)


def test_a_nan_between_logging_steps_still_stops_the_default_policy_naming_its_step(tmp_path):
    # the default nan_inf_policy=error reads its verdict at the next logging step; it names the first bad step
    # and sets global_step back to the last finite one, as the per-step check did
    model = poisonable(RegressionModel)()

    class PoisonAtStep6(HostReadCounter):
        def on_step_begin(self, args, state, control, **kwargs):
            super().on_step_begin(args, state, control, **kwargs)
            self.state = state
            if state.global_step + 1 == 6:
                model.poisoned = True

    counter = PoisonAtStep6()
    with pytest.raises(NonFiniteLossError, match=r"step 6: gradient norm is nan .*nan_inf_policy='skip'"):
        run(tmp_path, counter, model=model)
    assert counter.reads_outside_logging_steps(5) == {}
    assert not counter.reads[6] and not counter.reads[7]  # the check waits for step 8, a logging step
    assert 8 not in counter.logged_steps  # it raised before logging (or saving) a non-finite model
    assert counter.state.global_step == 5


def test_the_multi_process_stop_check_rides_on_logging_steps_at_most_ten_steps_apart():
    from paddletrainer.runtime.signals import MAX_CHECK_INTERVAL, GracefulStop, check_interval

    assert check_interval("steps", 4) == 4 and check_interval("steps", 500) == MAX_CHECK_INTERVAL == 10
    assert check_interval("epoch", 4) == MAX_CHECK_INTERVAL and check_interval("steps", 0) == MAX_CHECK_INTERVAL
    calls = []

    class TwoRanks(GracefulStop):  # the collective replaced by a recorder; every rank counts the same steps
        def should_stop(self, topology=None):
            calls.append(topology.step)
            return bool(self.signum)

    stop = TwoRanks(every=4)
    topology = type("Topo", (), {"world_size": 2})()
    for step in range(1, 10):
        topology.step = step
        if step == 5:
            stop.request()
        if stop.agreed(topology, step):
            break
    assert calls == [4, 8] and step == 8  # asked only at multiples of `every`; the stop waits for the next one
