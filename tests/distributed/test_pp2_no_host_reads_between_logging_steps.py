"""A pp2 launch of the tiny Llama through the public Trainer: on every rank, an optimizer step that does not log
reads no tensor value on the host (gradient sync, clipping by the global norm, the default NaN/inf policy, the
stop-signal agreement and the loss accumulation all stay on the device), while the logging steps do. The first
step may only read the pipeline's tensor shapes (exchanged once); reads inside the model's own code (PaddleNLP's
Llama loss tests ``if count == 0``) are the model's and are not counted. The one-process counterpart is tests/unit/test_no_host_reads_between_logging_steps.py."""
from __future__ import annotations

import math

from launcher import launch, read_results

WORKER = "host_reads_worker.py"
MAX_STEPS, LOGGING_STEPS = 9, 3


def test_pp2_steps_between_logging_steps_read_nothing_on_the_host_on_every_rank(tmp_path, llama_weights):
    options = dict(model="llama", weights=llama_weights, num_samples=96, per_device_train_batch_size=2,
                   gradient_accumulation_steps=2, pipeline_parallel_degree=2, learning_rate=0.01, max_grad_norm=0.5,
                   lr_scheduler_type="linear", warmup_steps=1, max_steps=MAX_STEPS, logging_steps=LOGGING_STEPS,
                   save_steps=100, seed=7, disable_tqdm=True, report_to="none", remove_unused_columns=False,
                   output_dir=tmp_path / "out", result_dir=tmp_path / "res")
    args = [str(x) for key, value in options.items() for x in (f"--{key}", value)]
    launch(WORKER, 2, args, tmp_path)
    for rank in read_results(tmp_path / "res", 2):
        assert rank["logged_steps"] == [3, 6, 9]
        assert rank["outside"] == {}, rank["outside"]
        # the first step reads only to exchange the pipeline's tensor shapes (Paddle's p2p meta, cached after)
        assert all("recv_meta" in read for read in rank["step1"]), rank["step1"]
        assert all(n > 0 for n in rank["reads_per_logged_step"])  # the loss is read (and broadcast) there
        assert len(rank["losses"]) == 3 and all(math.isfinite(x) for x in rank["losses"])
