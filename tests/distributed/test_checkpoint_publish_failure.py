"""A save whose publish (or preparation) fails on rank 0 only fails on every rank with rank 0's error, instead of
leaving the other ranks waiting in the collective that ends the save (``workers/publish_failure_worker.py``)."""
from __future__ import annotations

import os

from launcher import launch, read_results


def test_a_publish_that_fails_on_rank_0_fails_every_rank_with_the_same_error(tmp_path):
    out = tmp_path / "out"
    launch("publish_failure_worker.py", 2, [out, tmp_path / "res"], tmp_path, timeout=120)
    ranks = read_results(tmp_path / "res", 2)
    for case in ("rename", "rotate", "stale"):
        assert all(r[case] is not None and r[case]["type"] == "CheckpointError" for r in ranks), (case, ranks)
        assert ranks[0][case]["message"] == ranks[1][case]["message"], (case, ranks)
    rename, rotate, stale = (ranks[1][c]["message"] for c in ("rename", "rotate", "stale"))
    assert str(out / "checkpoint-2") in rename and (out / "checkpoint-2" / "notes.txt").exists()
    kept = [n for n in os.listdir(out) if n.startswith("checkpoint-2.tmp-")]
    assert len(kept) == 1 and f"left in {out / kept[0]}" in rename  # the complete save, not deleted
    assert str(out / "checkpoint-1") in rotate and "was published" in rotate
    assert (out / "checkpoint-3" / ".checkpoint_complete").exists()
    assert "output_dir.lock" in stale and not (out / "checkpoint-4").exists()
