"""parallel.host_allocator: with the mmap threshold held, a freed host tensor leaves the process (stage 3 on CPU)."""
import subprocess
import sys
import textwrap

import pytest

from paddletrainer.parallel import host_allocator

# In a fresh process: free one 16 MiB tensor (glibc then raises its mmap threshold to 16 MiB), optionally hold the
# threshold, then allocate 64 tensors of 4 MiB, each followed by a small one that stays alive (stage 3's gathered
# parameters between the slices that live on), free the 4 MiB ones and print how much resident memory that freed.
CHILD = textwrap.dedent("""
    import sys
    import paddle
    from paddletrainer.metrics.process_memory import current_rss_bytes
    from paddletrainer.parallel import host_allocator

    big = paddle.ones([4 * 2**20], dtype="float32")
    del big
    if sys.argv[1] == "hold":
        assert host_allocator.hold_mmap_threshold()
    gathered, kept = [], []
    for _ in range(64):
        gathered.append(paddle.ones([2**20], dtype="float32"))
        kept.append(paddle.ones([1024], dtype="float32"))
    before = current_rss_bytes()
    del gathered
    print((before - current_rss_bytes()) // 2**20)
""")


def _freed_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_allocator._glibc() is None, reason="glibc's allocator only")
def test_freed_tensors_leave_the_process_once_the_mmap_threshold_is_held():
    # 64 × 4 MiB = 256 MiB freed: without the hold glibc keeps it in its heap (the control, proving the setup
    # reproduces stage 3's slack), with it the pages go back
    assert _freed_mib("default") < 64
    assert _freed_mib("hold") >= 200


def test_hold_mmap_threshold_refuses_a_non_positive_threshold():
    with pytest.raises(ValueError, match="threshold must be a positive byte count"):
        host_allocator.hold_mmap_threshold(0)
