"""Rank 0's publish or save preparation fails on a 2-process save; every rank must raise the same error.

``python publish_failure_worker.py <out_dir> <result_dir>``. Three saves of a tiny model, each made to fail on rank 0
only: (rotate) deleting an old checkpoint is refused (PermissionError); (stale) removing stale tmp dirs fails before
the save starts; (rename) a user's directory appears at the target between the write and the rename. Each rank
writes ``rank<r>.json``: every save's error type and message (None when it did not raise). A rank left waiting
for rank 0 would hang the launch instead (its timeout fails the test).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import errno  # noqa: E402

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from common import exit_cleanly, write_json  # noqa: E402
from paddletrainer.checkpoint import save as ckpt_io  # noqa: E402
from paddletrainer.checkpoint.local_state import topology_info  # noqa: E402


def user_dir_appears(ckpt_dir):
    """Rank 0 only: a user's directory appears at ``ckpt_dir`` right after the index and marker are written."""
    real = ckpt_io._write_index_and_marker

    def write_then_user_dir(tmp_dir, index):
        real(tmp_dir, index)
        os.makedirs(ckpt_dir)
        with open(os.path.join(ckpt_dir, "notes.txt"), "w") as f:
            f.write("mine")
    ckpt_io._write_index_and_marker = write_then_user_dir
    return lambda: setattr(ckpt_io, "_write_index_and_marker", real)


def refused(name, path):
    """Rank 0 only: ``ckpt_io.<name>`` raises PermissionError naming ``path``."""
    real = getattr(ckpt_io, name)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    setattr(ckpt_io, name, refuse)
    return lambda: setattr(ckpt_io, name, real)


def main():
    out, result_dir = sys.argv[1], sys.argv[2]
    dist.init_parallel_env()
    topo = topology_info(None)
    paddle.seed(0)
    model = paddle.nn.Linear(4, 4)
    ckpt_io.save_checkpoint(os.path.join(out, "checkpoint-1"), model=model, save_rng=False)
    cases = {  # the rename case last: its kept tmp dir would be removed as stale by a later save
        "rotate": (3, lambda: refused("rotate_checkpoints", os.path.join(out, "checkpoint-1"))),
        "stale": (4, lambda: refused("remove_stale_tmp_dirs", os.path.join(out, "output_dir.lock"))),
        "rename": (2, lambda: user_dir_appears(os.path.join(out, "checkpoint-2"))),
    }
    results = {}
    for case, (step, arm) in cases.items():
        undo = arm() if topo.rank == 0 else (lambda: None)
        try:
            ckpt_io.save_checkpoint(os.path.join(out, f"checkpoint-{step}"), model=model, save_rng=False,
                                    save_total_limit=1)
            results[case] = None
        except Exception as e:  # noqa: BLE001 - the test compares them
            results[case] = {"type": type(e).__name__, "message": str(e)}
        finally:
            undo()
    write_json(os.path.join(result_dir, f"rank{topo.rank}.json"), results)
    exit_cleanly(topo)


if __name__ == "__main__":
    main()
