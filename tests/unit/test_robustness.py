"""GracefulStop, TrainingInterrupted, CollectiveWatchdog, RobustnessCallback and friendly_errors in one process."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.checkpoint import is_complete_checkpoint, list_complete_checkpoints
from paddletrainer.errors import TrainingInterrupted, friendly_errors
from paddletrainer.runtime import WATCHDOG_EXIT_CODE, CollectiveWatchdog, GracefulStop, RobustnessCallback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ours(stderr: str) -> list:
    """stderr without Paddle's import-time warnings (ccache notice)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and "ccache" not in ln and "warnings.warn" not in ln]


def run_script(code: str, timeout: float = 60, **env):
    full_env = dict(os.environ, PYTHONPATH=REPO, **env)
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    return proc, time.time() - started


# ------------------------------------------------------------------------------------------- GracefulStop
def test_sigterm_only_sets_the_flag_and_uninstall_restores_the_previous_handler():
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        stop = GracefulStop().install()
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        assert not stop.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread
        assert stop.requested and stop.signum == signal.SIGTERM
        assert stop.should_stop()  # one process: just the flag
        assert calls == []  # the previous handler was not called
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) is previous
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_context_manager_restores_sigint_and_a_second_signal_falls_back_to_the_previous_handler():
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        assert signal.getsignal(signal.SIGINT) == stop._handle
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C: Python's default handler, at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        assert not stop.installed
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, original)


def test_a_handler_left_behind_by_a_failed_train_does_not_swallow_ctrl_c(tmp_path):
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        class Boom(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                raise RuntimeError("a bug in the middle of training")

        trainer = make_trainer(tmp_path / "run", [Boom()], robust=True)
        with pytest.raises(RuntimeError, match="a bug"):
            trainer.train()
        # train() is gone: Ctrl-C must act at once, as it did before train()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, original)


def test_training_interrupted_is_a_clean_systemexit_with_128_plus_signal():
    exc = TrainingInterrupted(signal.SIGTERM, 12, "/out/checkpoint-12")
    assert isinstance(exc, SystemExit) and not isinstance(exc, Exception)
    assert exc.code == 143
    assert str(exc) == ("training interrupted by SIGTERM at step 12; checkpoint saved to /out/checkpoint-12 "
                        "(resume with --resume_from_checkpoint /out/checkpoint-12)")
    proc, _ = run_script("""
        import signal
        from paddletrainer.errors import TrainingInterrupted
        try:
            raise TrainingInterrupted(signal.SIGINT, 3, None)
        except Exception:
            print("swallowed")  # must not happen
    """)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "swallowed" not in proc.stdout


# ------------------------------------------------------------------------------------------- watchdog
def test_watchdog_turns_a_hang_into_an_error_naming_rank_phase_and_step():
    proc, elapsed = run_script("""
        import time
        from paddletrainer.runtime import CollectiveWatchdog
        watchdog = CollectiveWatchdog(1, rank=3)
        with watchdog.phase("optimizer", step=120):
            time.sleep(30)
        print("not reached")
    """)
    assert proc.returncode == WATCHDOG_EXIT_CODE, proc.stderr
    assert elapsed < 20
    first = ours(proc.stderr)[0]
    assert first.startswith("rank 3 stuck in 'optimizer' at step 120 for 1s"), proc.stderr
    assert "a collective is probably waiting for a rank that died or diverged" in first
    assert "most recent call first" in proc.stderr and "time.sleep" not in first  # faulthandler's stack dump
    assert "<string>" in proc.stderr  # the main thread's frame (the sleeping line) is in the dump
    assert "not reached" not in proc.stdout


def test_watchdog_does_not_fire_when_phases_finish_in_time_and_is_free_when_disabled():
    fired = []
    watchdog = CollectiveWatchdog(0.5, rank=0, on_timeout=fired.append)
    for step in range(4):
        with watchdog.phase("forward_backward", step=step):
            time.sleep(0.2)
    time.sleep(0.7)  # disarmed between phases: idle time is not a hang
    assert fired == []
    watchdog.enter("data", step=5)  # event-driven use: enter() re-arms, disarm() stops
    time.sleep(0.3)
    watchdog.enter("forward_backward", step=5)
    time.sleep(0.3)
    watchdog.disarm()
    time.sleep(0.4)
    assert fired == []
    with watchdog.phase("checkpoint_save", step=6):
        time.sleep(1.0)
    assert len(fired) == 1 and "rank 0 stuck in 'checkpoint_save' at step 6" in fired[0]
    watchdog.close()

    off = CollectiveWatchdog(None, rank=0)
    assert off.phase("a") is off.phase("b")  # one shared no-op context
    with off.phase("optimizer", step=1):
        pass
    off.enter("data")
    assert off._thread is None and not off.enabled


def test_watchdog_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError, match=r"collective_timeout_seconds=0 is invalid"):
        CollectiveWatchdog(0)


# ------------------------------------------------------------------------------------------- Trainer hook
import paddle  # noqa: E402


from toy_models import RegressionModel, regression_data  # noqa: E402


def make_trainer(out, callbacks=(), robust=False, **kw):
    """A small regression Trainer; ``robust=True`` makes sure a RobustnessCallback is in it (the Trainer's own
    once the lead has integrated it, else one added here) — then ``trainer.robust`` is that callback."""
    paddle.seed(3)
    base = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=6, logging_steps=1,
                save_steps=100, disable_tqdm=True, report_to="none", seed=1, lr_scheduler_type="linear")
    base.update(kw)
    trainer = Trainer(model=RegressionModel(), args=TrainingArguments(**base), train_dataset=regression_data(),
                      callbacks=list(callbacks))
    if robust:
        found = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RobustnessCallback)]
        if not found:
            found = [RobustnessCallback(trainer.topology, trainer.args.collective_timeout_seconds)]
            trainer.add_callback(found[0])
        assert len(found) == 1
        trainer.robust = found[0]
    return trainer


class SignalAt(TrainerCallback):
    """Sends ``signum`` to this process at the beginning of step ``step``."""

    def __init__(self, step, signum=signal.SIGTERM):
        self.step, self.signum = step, signum

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("async_save", [False, True])
def test_sigterm_mid_training_saves_a_checkpoint_stops_and_resumes_to_the_same_result(tmp_path, async_save):
    ref_trainer = make_trainer(tmp_path / "ref")
    ref_trainer.train()

    before = signal.getsignal(signal.SIGTERM)
    trainer = make_trainer(tmp_path / "run", [SignalAt(3)], robust=True, checkpoint_async_save=async_save,
                           collective_timeout_seconds=60)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.train()
    assert info.value.code == 128 + signal.SIGTERM and info.value.step == 3
    ckpt = tmp_path / "run" / "checkpoint-3"
    assert info.value.checkpoint == str(ckpt)
    assert is_complete_checkpoint(str(ckpt)) and list_complete_checkpoints(str(tmp_path / "run")) == [str(ckpt)]
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored when the stop is raised
    assert trainer.robust.watchdog.fired is None

    resumed = make_trainer(tmp_path / "run", robust=True)
    assert resumed.train(resume_from_checkpoint=str(ckpt)).global_step == 6
    assert step_losses(resumed) == pytest.approx(step_losses(ref_trainer), rel=1e-6)  # steps 1-3 restored, 4-6 retrained
    np.testing.assert_allclose(resumed.model.linear.weight.numpy(), ref_trainer.model.linear.weight.numpy(), rtol=1e-6)


def step_losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_robustness_callback_without_a_signal_changes_nothing(tmp_path):
    reference = make_trainer(tmp_path / "ref").train()
    before = signal.getsignal(signal.SIGINT)
    trainer = make_trainer(tmp_path / "run", robust=True, save_steps=2, collective_timeout_seconds=30)
    out = trainer.train()
    assert out.training_loss == reference.training_loss
    assert trainer.robust.watchdog.enabled and trainer.robust.watchdog._thread is not None  # it was armed
    assert signal.getsignal(signal.SIGINT) is before and trainer.robust.watchdog._deadline is None  # disarmed
    trainer.robust.watchdog.close()


# ------------------------------------------------------------------------------------------- friendly_errors
def test_friendly_errors_prints_one_line_and_exits_2_for_bad_input(capsys):
    @friendly_errors
    def main():
        TrainingArguments(output_dir="x", per_device_train_batch_size=0)

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "error: per_device_train_batch_size=0 is invalid: must be a positive number"
    assert "Traceback" not in err


def test_friendly_errors_in_a_script_no_traceback_unless_asked_and_bugs_still_propagate():
    script = """
        import sys
        from paddletrainer.errors import main_guard
        from paddletrainer.checkpoint import CheckpointError
        def main(kind):
            if kind == "value":
                raise ValueError("tensor_parallel_degree=3 is invalid")
            if kind == "ckpt":
                raise CheckpointError("corrupt checkpoint out/checkpoint-2: model_state.tp00_pp00.safetensors")
            raise KeyError("a bug")
        main_guard(main, sys.argv[1])
    """
    for kind, line in (("value", "error: tensor_parallel_degree=3 is invalid"),
                       ("ckpt", "error: corrupt checkpoint out/checkpoint-2: model_state.tp00_pp00.safetensors")):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), kind], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
        assert proc.returncode == 2 and ours(proc.stderr) == [line] and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), "value"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, PADDLETRAINER_TRACEBACK="1"), timeout=60)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError: tensor_parallel_degree=3" in proc.stderr
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), "bug"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
    assert proc.returncode == 1 and "KeyError: 'a bug'" in proc.stderr


def test_friendly_errors_reports_an_interruption_with_its_exit_code(capsys):
    @friendly_errors
    def main():
        raise TrainingInterrupted(signal.SIGTERM, 5, "out/checkpoint-5")

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 143
    assert capsys.readouterr().err.startswith("interrupted: training interrupted by SIGTERM at step 5")


# ------------------------------------------------------------------------------------------- NaN / inf policy
class NanWeightAt(TrainerCallback):
    """Makes the weight NaN right before the forward of step ``step`` (a numerical fault in the middle of a run)."""

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            model.linear.weight.set_value(paddle.full_like(model.linear.weight, float("nan")))


def test_nan_inf_policy_error_stops_with_the_step_and_skip_drops_only_the_bad_update(tmp_path):
    from paddletrainer.trainer import NonFiniteLossError

    trainer = make_trainer(tmp_path / "error", [NanWeightAt(2)])
    with pytest.raises(NonFiniteLossError, match=r"step 2: gradient norm is nan .*nan_inf_policy='skip'"):
        trainer.train()
    assert trainer.state.global_step == 1

    class HealAfter(TrainerCallback):  # the fault is transient: the next step starts from finite weights again
        def on_optimizer_end(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == 2:
                model.linear.weight.set_value(paddle.full_like(model.linear.weight, 0.5))

    trainer = make_trainer(tmp_path / "skip", [NanWeightAt(2), HealAfter()], nan_inf_policy="skip")
    out = trainer.train()
    assert out.global_step == 6 and trainer.state.skipped_steps == 1
    assert np.isfinite(trainer.model.linear.weight.numpy()).all()
