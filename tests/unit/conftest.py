"""Fixtures the unit tests share."""
import pytest

# what paddle.distributed.launch sets in each process; the layout reads the world size from them
LAUNCH_VARS = ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK")


@pytest.fixture
def world(monkeypatch):
    """``world(size, local_rank=None)``: the launch environment of a job of ``size`` processes (none of the launch
    variables of the process running the tests leaks in), so layouts are resolved before any process group."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)

    def set_world(size, local_rank=None):
        monkeypatch.setenv("PADDLE_TRAINERS_NUM", str(size))
        if local_rank is not None:
            monkeypatch.setenv("PADDLE_RANK_IN_NODE", str(local_rank))

    return set_world
