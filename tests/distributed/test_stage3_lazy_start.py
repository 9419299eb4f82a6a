"""Stage 3 starts a model built under ``paddle.LazyGuard`` from each rank's slices and trains it under a
per-process memory limit that one process of the same model cannot train under, with one process's losses.

The model: a 16-layer 2048-wide MLP (67.1M fp32 parameters, 256 MiB; with gradients and AdamW's two moments
1 GiB of training state on one process, half of it per stage-3 rank). The limit is ``RLIMIT_DATA`` (Paddle's
CPU allocator draws from the data segment and raises ``ResourceExhausted`` past it; ``RLIMIT_AS`` would also
count the address space the libraries map). Measured on Paddle 3.3.1, CPU: one process needs more than
1200 MiB of data segment (its VmData is 1270 MiB after 3 steps, peak RSS 1359 MiB); each stage-3 rank trains
within 1100 MiB (not within 950; peak RSS 1138 MiB). ``MALLOC_MMAP_THRESHOLD_`` is fixed at 1 MiB for every
run: glibc otherwise raises its mmap threshold to each freed block's size, so the 16 MiB layers stage 3 gathers
and frees every micro-batch land in the heap and fragment it (peak RSS 1410 MiB per rank without it).
On two ranks with AdamW the training state (2P per rank) outweighs the whole model (P), so the run's peak is
the training's; the lazy start lowers the start-up peak: 657 MiB per rank after the wrap (VmHWM), against
810 MiB for the same model built eagerly, whose slices Paddle's ``_param_storage`` cuts as views of a
whole-parameter buffer that stays alive until the first step.
"""
from __future__ import annotations

import pytest

from launcher import launch, read_results, run_single
from trainer_phases import close

WORKER = "stage3_lazy_worker.py"
LIMIT_MIB = 1150
STEPS = 3


def args(out, res, **options):
    base = dict(output_dir=out, result_dir=res, max_steps=STEPS, logging_steps=1, save_strategy="no",
                learning_rate=1e-5, lr_scheduler_type="constant", seed=7, disable_tqdm=True, report_to="none",
                width=2048, depth=16, gradient_accumulation_steps=2)
    base.update(options)
    return [item for key, value in base.items() for item in (f"--{key}", str(value))]


@pytest.fixture
def fixed_mmap_threshold(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # the launcher passes the environment on


def test_stage3_starts_a_lazily_built_model_one_process_cannot_train_under_the_limit(tmp_path, fixed_mmap_threshold):
    run_single(WORKER, args(tmp_path / "ref_out", tmp_path / "ref", per_device_train_batch_size=4), timeout=300)
    reference = read_results(tmp_path / "ref", 1)[0]

    run_single(WORKER, args(tmp_path / "one_out", tmp_path / "one", per_device_train_batch_size=4,
                            limit_mib=LIMIT_MIB), timeout=300)
    one = read_results(tmp_path / "one", 1)[0]
    assert "out_of_memory" in one, f"one process trained under {LIMIT_MIB} MiB: the limit proves nothing ({one})"

    launch(WORKER, 2, args(tmp_path / "out", tmp_path / "res", per_device_train_batch_size=2, lazy=True,
                           sharding="stage3", sharding_parallel_degree=2, limit_mib=LIMIT_MIB), tmp_path)
    for rank, result in enumerate(read_results(tmp_path / "res", 2)):
        assert "out_of_memory" not in result, f"rank {rank}: {result}"
        assert result["limit_mib"] == LIMIT_MIB
        close(result["losses"], reference["losses"], f"rank {rank} losses", rtol=1e-5)
        close(result["grad_norms"], reference["grad_norms"], f"rank {rank} grad norms", rtol=1e-5)


def test_a_lazily_built_stage3_model_resumes_a_one_process_checkpoint_and_continues_its_curve(tmp_path):
    small = dict(width=96, depth=3, learning_rate=0.01, max_steps=4, sharding_stage3_segment_size=1000)
    run_single(WORKER, args(tmp_path / "ref_out", tmp_path / "ref", per_device_train_batch_size=4,
                            save_strategy="steps", save_steps=2, **small))
    reference = read_results(tmp_path / "ref", 1)[0]
    launch(WORKER, 2, args(tmp_path / "out", tmp_path / "res", per_device_train_batch_size=2, lazy=True,
                           sharding="stage3", sharding_parallel_degree=2,
                           resume_from_checkpoint=tmp_path / "ref_out" / "checkpoint-2", **small), tmp_path)
    for rank, result in enumerate(read_results(tmp_path / "res", 2)):
        # steps 3 and 4, trained from the loaded slices (the first two entries are the checkpoint's history)
        close(result["losses"][2:], reference["losses"][2:], f"rank {rank} losses after resuming", rtol=1e-5)
        close(result["grad_norms"][2:], reference["grad_norms"][2:], f"rank {rank} grad norms", rtol=1e-5)
