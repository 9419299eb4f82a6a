"""Phase timers (on and off) and peak memory."""
import re

import pytest

from paddletrainer.metrics import PhaseTimers, memory_logs, peak_memory_bytes


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_disabled_timers_are_one_shared_no_op_and_never_sync():
    syncs = []
    timers = PhaseTimers(enabled=False, sync=lambda: syncs.append(1))
    assert timers("data") is timers("optimizer")
    with timers("data"):
        pass
    assert timers.elapsed() == {} and timers.report_and_reset() == {} and syncs == []


def test_enabled_timers_sync_at_both_ends_and_accumulate_per_phase():
    clock, syncs = FakeClock(), []
    timers = PhaseTimers(enabled=True, sync=lambda: syncs.append(clock.now), clock=clock)
    for seconds in (0.25, 0.75):
        with timers("forward_backward"):
            clock.now += seconds
    with timers("optimizer"):
        clock.now += 0.1
    assert len(syncs) == 6
    assert timers.elapsed(reset=False) == pytest.approx({"forward_backward": 1.0, "optimizer": 0.1})
    assert timers.report_and_reset() == pytest.approx({"forward_backward_time": 0.5, "optimizer_time": 0.1})
    assert timers.elapsed() == {}


def test_an_exception_inside_a_phase_is_still_timed_and_propagates():
    clock = FakeClock()
    timers = PhaseTimers(enabled=True, sync=lambda: None, clock=clock)
    with pytest.raises(RuntimeError):
        with timers("checkpoint_save"):
            clock.now += 2.0
            raise RuntimeError("disk full")
    assert timers.elapsed() == {"checkpoint_save": 2.0}


def test_default_sync_is_a_harmless_no_op_on_cpu():
    timers = PhaseTimers(enabled=True)
    with timers("data"):
        pass
    assert list(timers.elapsed()) == ["data"]


def test_cpu_peak_memory_is_the_kernels_high_water_mark_in_bytes():
    # /proc reports the same high-water mark (VmHWM, in kB); agreeing with it checks the unit conversion.
    peak = peak_memory_bytes()
    with open("/proc/self/status") as f:
        hwm_kb = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1))
    assert abs(peak - hwm_kb * 1024) <= 0.05 * peak
    assert memory_logs()["peak_memory_gb"] == pytest.approx(peak / 2**30, abs=1e-3)


def test_the_process_memory_module_holds_the_peak_the_rss_now_and_the_per_stage_tracker():
    import numpy as np

    from paddletrainer.metrics import MemoryTracker, current_rss_bytes
    from paddletrainer.metrics import process_memory

    assert {"peak_memory_bytes", "memory_logs", "current_rss_bytes", "MemoryTracker"} <= set(process_memory.__all__)
    with open("/proc/self/status") as f:  # the RSS now, as the kernel reports it
        rss_kb = int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))
    now = current_rss_bytes()
    assert abs(now - rss_kb * 1024) <= 0.05 * rss_kb * 1024
    tracker = MemoryTracker(enabled=True)
    tracker.start("eval")
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB touched inside the stage
    metrics = tracker.stop("eval")
    assert metrics["eval_mem_cpu_alloc_delta"] >= (48 << 20) and block.sum() == 64 << 20
