"""Packed rows (PaddleNLP's zero-padding data, both mask formats) train on every layout like one process.

One launch per layout (``workers/packed_worker.py``) trains the tiny Llama 3 steps on rows of several fine-tuning
documents each, once with FlashMask's ``attn_mask_startend_row_indices`` and once with the block-diagonal
``attention_mask``, and evaluates on packed rows: every logged loss, grad norm and the eval loss equal one process
on the same rows (1e-5), and the two formats equal each other. Under sep every rank's heads attend over the whole
sequence with the document mask it carries; under cp the ring attention masks (and skips) chunk pairs by document;
under pp the stages pass the mask along. CI runs tp2, sep2 and cp2 (about 30 s each); ``PT_FULL_MATRIX=1`` adds pp2.
The one-process claims (a packed row's loss is the unpacked documents') are tests/unit/test_packed_sequences.py.
"""
from __future__ import annotations

import os

import pytest

from checks import RTOL
from launcher import launch, read_results, run_single

WORKER = "packed_worker.py"
FULL = os.environ.get("PT_FULL_MATRIX") == "1"
ROWS = 24  # 3 steps of 8 rows


def packed_args(out, result_dir, weights, **options):
    base = dict(model="llama", weights=weights, num_samples=ROWS, output_dir=out, result_dir=result_dir, max_steps=3,
                logging_steps=1, learning_rate=0.01, max_grad_norm=0.8, lr_scheduler_type="constant", seed=7,
                disable_tqdm=True, report_to="none", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                per_device_eval_batch_size=2, save_strategy="no")
    base.update(options)
    return [item for key, value in base.items() for item in (f"--{key}", str(value))]


@pytest.fixture(scope="module")
def packed_reference(tmp_path_factory, llama_weights):
    work = tmp_path_factory.mktemp("packed_one_process")
    run_single(WORKER, packed_args(work / "out", work / "res", llama_weights))
    ref = read_results(work / "res", 1)[0]
    for key in ("losses", "grad_norms"):
        assert ref["startend"][key] == pytest.approx(ref["attention_mask"][key], rel=RTOL), key
    assert ref["startend"]["eval_loss"] == pytest.approx(ref["attention_mask"]["eval_loss"], rel=RTOL)
    assert len(ref["startend"]["trained_tokens_per_second"]) == 3
    return ref


def _full_only():
    return [pytest.mark.full_matrix] + ([pytest.mark.skip(reason="full matrix only: PT_FULL_MATRIX=1")] if not FULL else [])


LAYOUTS = [
    pytest.param("tp2", dict(tensor_parallel_degree=2), id="tp2"),
    pytest.param("sep2", dict(sep_parallel_degree=2), id="sep2"),
    pytest.param("cp2", dict(context_parallel_degree=2), id="cp2"),
    pytest.param("pp2", dict(pipeline_parallel_degree=2), id="pp2", marks=_full_only()),
]


@pytest.mark.parametrize("name,options", LAYOUTS)
def test_packed_rows_in_both_formats_train_and_evaluate_like_one_process(tmp_path, packed_reference, llama_weights,
                                                                         name, options):
    launch(WORKER, 2, packed_args(tmp_path / "out", tmp_path / "res", llama_weights, **options), tmp_path,
           timeout=420)
    for r, result in enumerate(read_results(tmp_path / "res", 2)):
        for mask_format, ref in packed_reference.items():
            what = f"{name} rank {r} {mask_format}"
            got = result[mask_format]
            assert got["losses"] == pytest.approx(ref["losses"], rel=RTOL), what
            assert got["grad_norms"] == pytest.approx(ref["grad_norms"], rel=RTOL), what
            assert got["eval_loss"] == pytest.approx(ref["eval_loss"], rel=RTOL), what
