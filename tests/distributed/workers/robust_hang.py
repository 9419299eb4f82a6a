"""Two ranks, one of which never reaches the collective: the watchdog must turn the hang into an error.

Rank 1 sleeps ``HANG_SECONDS`` before its all-reduce (a rank that died or diverged); rank 0 enters the
all-reduce inside ``CollectiveWatchdog(timeout).phase("optimizer", step=7)``. Expected: rank 0 prints
``rank 0 stuck in 'optimizer' at step 7 ...``, dumps its stacks and exits with WATCHDOG_EXIT_CODE long before
rank 1 wakes up; the launcher then tears the job down. ``python robust_hang.py <timeout_seconds>``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddletrainer.runtime import CollectiveWatchdog  # noqa: E402

HANG_SECONDS = 120


def main():
    timeout = float(sys.argv[1])
    dist.init_parallel_env()
    rank = dist.get_rank()
    x = paddle.to_tensor([1.0])
    dist.all_reduce(x)  # both ranks are alive and connected
    if rank == 1:
        time.sleep(HANG_SECONDS)
    watchdog = CollectiveWatchdog(timeout, rank=rank)
    with watchdog.phase("optimizer", step=7):
        dist.all_reduce(x)
    print("all-reduce returned", flush=True)


if __name__ == "__main__":
    main()
