"""The public Trainer on every parallel layout, against one process with the same global batch (8).

One launch per layout (``workers/trainer_phases_worker.py``) checks all of it on every rank:

* every step's logged loss and grad norm (steps 1-3);
* ``evaluate()`` on 13 samples (a multiple of no batch size) equals the mean loss computed directly over
  exactly those 13 samples; ``predict()`` returns 13 predictions, in dataset order;
* the checkpoint saved at step 3 (``max_steps 3``) resumed in the same layout with ``max_steps 6``, and the
  one-process checkpoint resumed in this layout, both continue the uninterrupted 6-step curve (to 1e-5; where
  the launch also trains the 6 steps uninterrupted, the same-layout resume must match it bit for bit);
* fine-tuning documents (4-16 positions, prompts labelled -100, right-padded: micro-batches of different
  trained-token counts; ``--finetune``, on the rows that name it and every full-matrix Llama row): every logged
  loss, grad norm and the eval loss equal one process holding the global batch in one micro-batch (1e-5): the
  loss is the mean over the global batch's trained tokens on every layout, and the reference's eval loss is the
  token mean computed without the Trainer (1e-6);
* packed rows (``--packed``: several documents per 16-token row, PaddleNLP's zero-padding formats, FlashMask's
  document ends and the block-diagonal mask; on dp2, tp2·SP, sharding stage3×2, the tp2 launch of the interleaved
  test, sep2, cp2, and the full matrix's pp2 and sharding rows): every logged loss, grad norm and the eval loss
  equal one process (1e-5) — the document mask travels whole under sep and cp, the Pipe stages carry it under pp,
  and the sharding stages reduce the gradients of micro-batches of different trained-token counts.

The interleaved pipeline (``virtual_pp_degree``) has its own CI test at the end: pp2·vpp2 as above, then its
checkpoint resumed under tp2 and in one process.

CI runs the layouts marked ``ci`` (the 16-process one included); ``PT_FULL_MATRIX=1`` runs all of them
(see README, Tests). A tiny PaddleNLP Llama (``LlamaForCausalLMPipe`` under pp, TP ranks from the training
arguments) everywhere, and a plain ``paddle.nn.Layer`` regression net on the dp/sharding layouts of the full
matrix (tensor parallel refuses a model without tp layers).
"""
from __future__ import annotations

import os

import pytest

from launcher import launch, read_results, run_single
from paddletrainer.checkpoint import read_index
from trainer_phases import (GA, GLOBAL_BATCH, RTOL, WORKER, assert_curve, assert_finetune, assert_packed,
                            assert_predictions, close, phase_args)

FULL = os.environ.get("PT_FULL_MATRIX") == "1"


def layout(name, dp=1, sharding=1, stage=0, tp=1, pp=1, ga=GA, ci=False, mlp=False, sep=1, cp=1, finetune=None,
           packed=False, **extra):
    """Global batch 8 on every layout; ``mlp``: also the plain regression net (needs no tp/pp layers);
    ``finetune``: the Llama's ``--finetune`` phases (default: the full matrix's rows, not CI's); ``packed``: its
    ``--packed`` phases (packed rows, both mask formats)."""
    data_world = dp * sharding
    options = dict(per_device_train_batch_size=GLOBAL_BATCH // (ga * data_world), gradient_accumulation_steps=ga)
    if sharding > 1:
        options.update(sharding=f"stage{stage}", sharding_parallel_degree=sharding)
    if tp > 1:
        options["tensor_parallel_degree"] = tp
    if pp > 1:
        options["pipeline_parallel_degree"] = pp
    if sep > 1:
        options["sep_parallel_degree"] = sep
    if cp > 1:
        options["context_parallel_degree"] = cp
    options.update(extra)
    full_only = [pytest.mark.full_matrix] + ([pytest.mark.skip(reason="full matrix only: PT_FULL_MATRIX=1")] if not FULL else [])
    finetune = finetune if finetune is not None else ("" if ci else "own")
    llama_options = dict(options, finetune=finetune) if finetune else options
    if packed:
        llama_options = dict(llama_options, packed=True)
    params = [pytest.param("llama", name, dp * sharding * tp * pp * sep * cp, llama_options, id=f"llama-{name}",
                           marks=[] if ci else full_only)]
    if mlp:  # the plain paddle.nn.Layer: full matrix only (CI keeps its launches for the Llama)
        params.append(pytest.param("mlp", name, dp * sharding * tp * pp, options, id=f"mlp-{name}", marks=full_only))
    return params


LAYOUTS = [
    # dp2×GA2 and dp2 on fine-tuning documents; packed rows
    *layout("dp2", dp=2, ci=True, mlp=True, stream=True, uninterrupted=True, finetune="own,1", packed=True),
    *layout("dp4", dp=4, mlp=True),
    *layout("s1x2", sharding=2, stage=1, mlp=True, packed=True),
    *layout("s2x2", sharding=2, stage=2, mlp=True, packed=True),
    # stage 3 with every Llama weight matrix sliced across the 2 ranks (> 1000 elements; the norms stay whole):
    # the resumes must restore the slices' optimizer states (bit-exact against its own uninterrupted run)
    *layout("s3x2", sharding=2, stage=3, ci=True, mlp=True, sharding_stage3_segment_size=1000, uninterrupted=True,
            packed=True),
    *layout("s2x2_dp2", dp=2, sharding=2, stage=2, mlp=True, packed=True),
    *layout("tp2", tp=2),
    *layout("pp2", pp=2, packed=True),
    *layout("pp4", pp=4, ga=4),  # the pipeline needs a micro-batch per stage
    *layout("tp2_pp2", tp=2, pp=2, ci=True, finetune="own"),
    *layout("dp2_tp2", dp=2, tp=2),
    *layout("s1x2_tp2_pp2", sharding=2, stage=1, tp=2, pp=2, packed=True),
    *layout("dp2_tp2_pp2", dp=2, tp=2, pp=2),
    *layout("dp2_s1x2_tp2_pp2", dp=2, sharding=2, stage=1, tp=2, pp=2, ci=True, uninterrupted=True),
    # sharding stage1 V2 (split_param: parameters cut into flat slices of reduce-scattered comm buffers; CI runs
    # s1v2x2 in the checkpoint test below)
    *layout("s1v2x2", sharding=2, stage=1, mlp=True, sharding_parallel_config="split_param", packed=True),
    *layout("dp2_s1v2x2_tp2_pp2", dp=2, sharding=2, stage=1, tp=2, pp=2, ci=True,
            sharding_parallel_config="split_param"),
    # sequence parallel inside tp (CPU: parallel/cpu/reduce_scatter.py); the 8-process one fuses the
    # allreduce of the replicated (norm) gradients
    *layout("tp2_sp", tp=2, ci=True, sequence_parallel=True, packed=True),
    *layout("dp2_tp2_sp_pp2", dp=2, tp=2, pp=2, ci=True, sequence_parallel=True,
            fuse_sequence_parallel_allreduce=True),
    # interleaved pipeline: GA >= 2·pp runs Paddle's interleaved 1F1B, GA = pp its all-forward-then-backward
    # variant (CI runs pp2·vpp2 in the checkpoint test below)
    *layout("pp2_vpp2", pp=2, ga=4, virtual_pipeline_model_parallel_size=2),
    *layout("pp2_vpp2_fthenb", pp=2, ga=2, virtual_pipeline_model_parallel_size=2),
    *layout("tp2_pp2_vpp2", tp=2, pp=2, ga=4, virtual_pipeline_model_parallel_size=2),
    # sequence-segment parallel (Ulysses; CPU: the all-to-all fill of parallel/cpu/all_to_all.py): sep ranks
    # read the same samples, each trains on half of every sequence (CI runs sep2 in the checkpoint test below)
    *layout("dp2_sep2", dp=2, sep=2, ci=True),
    *layout("tp2_sep2", tp=2, sep=2, ci=True),
    # the 8-process sep row: a dp replica's gradients average over dp x sep ranks, heads split over tp x sep
    *layout("dp2_tp2_sep2", dp=2, tp=2, sep=2, ci=True),
    *layout("s1x2_sep2", sharding=2, stage=1, sep=2, packed=True),
    *layout("pp2_sep2", pp=2, sep=2),
    # ring context parallel (CPU: our ring attention, parallel/ring_attention.py, in Llama's RingFlashAttention
    # place): cp ranks read the same samples, each trains on chunks r and 3-r of 4 of every sequence (CI runs
    # cp2 in the checkpoint test below)
    *layout("dp2_cp2", dp=2, cp=2),
    *layout("tp2_cp2", tp=2, cp=2),
]


@pytest.mark.parametrize("model", ["llama", "mlp"])
def test_one_process_resume_with_larger_max_steps_is_bit_exact_and_eval_counts_each_sample_once(trainer_reference, model):
    ref, _ = trainer_reference(model)
    assert ref["extended"]["losses"] == ref["uninterrupted"]["losses"]  # bit-exact on the same layout
    assert ref["extended"]["grad_norms"] == ref["uninterrupted"]["grad_norms"]
    assert ref["extended"]["max_steps"] == ref["extended"]["global_step"] == 6
    assert ref["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=1e-6)
    assert ref["short"]["predicted"]["shape"][0] == ref["stream"]["predicted"]["shape"][0] == 13


def test_one_micro_batch_reference_eval_loss_is_the_token_mean_computed_without_the_trainer(finetune_reference):
    assert finetune_reference["eval_loss"] == pytest.approx(finetune_reference["direct_eval_loss"], rel=1e-6)


def assert_layout_claims(r, ref, at):
    """One rank's results of one launch against one process: the short run's curve, its eval loss against the
    directly computed mean, its predictions in order, and both resumes on the uninterrupted curve."""
    assert_curve(r["short"], ref["short"], 3, f"{at} short run")
    assert r["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=RTOL), at
    assert_predictions(r["short"]["predicted"], ref["short"]["predicted"], at)
    assert_curve(r["extended"], ref["uninterrupted"], 6, f"{at} resumed with max_steps 6")
    assert_curve(r["foreign"], ref["uninterrupted"], 6, f"{at} one-process checkpoint resumed")


@pytest.mark.parametrize("model,name,nproc,options", LAYOUTS)
def test_trainer_layout_trains_evaluates_predicts_and_resumes_like_one_process(
    request, tmp_path, trainer_reference, llama_weights, model, name, nproc, options
):
    ref, foreign = trainer_reference(model)
    finetune_ref = request.getfixturevalue("finetune_reference") if options.get("finetune") else None
    packed_ref = request.getfixturevalue("packed_reference") if options.get("packed") else None
    launch(WORKER, nproc, phase_args(model, tmp_path / "out", tmp_path / "res", llama_weights,
                                     foreign_checkpoint=foreign, **options), tmp_path, timeout=420)
    for r in read_results(tmp_path / "res", nproc):
        at = f"{name} rank {r['rank']}"
        assert_layout_claims(r, ref, at)
        if finetune_ref is not None:
            assert_finetune(r, finetune_ref, at)
        if packed_ref is not None:
            assert_packed(r, packed_ref, at)
        # the sequence-parallel layers are really in the model (norm weights marked for the tp allreduce)
        assert (r["sequence_parallel_params"] > 0) == bool(options.get("sequence_parallel")), at
        if model == "llama" and options.get("sharding_stage3_segment_size"):
            # stage 3 really sliced parameters across the ranks (else the resumes prove nothing about slices);
            # both resumes restore the slices' optimizer states: the one-process curve to 1e-6
            assert r["stage3_sliced_params"] > 0, at
            for phase in ("extended", "foreign"):
                for series in ("losses", "grad_norms"):
                    close(r[phase][series], ref["uninterrupted"][series], f"{at} {phase} {series}", rtol=1e-6)
        if options.get("uninterrupted"):  # the same layout without the interruption: bit-exact
            assert r["extended"]["losses"] == r["uninterrupted"]["losses"], at
            assert r["extended"]["grad_norms"] == r["uninterrupted"]["grad_norms"], at
        if options.get("stream"):
            assert_curve(r["stream"], ref["stream"], 2, f"{at} stream")
            assert r["stream"]["eval_loss"] == pytest.approx(ref["stream"]["eval_loss"], rel=RTOL), at
            assert_predictions(r["stream"]["predicted"], ref["stream"]["predicted"], f"{at} stream")


def test_interleaved_pipeline_trains_like_one_process_and_its_checkpoint_resumes_under_tp2_and_one_process(
    tmp_path, trainer_reference, finetune_reference, packed_reference, llama_weights
):
    """pp2·vpp2 (4 chunks of one decoder layer; stage 0 holds layers 0 and 2): the layout's claims as above,
    then its step-3 checkpoint continues the one-process curve under tp2 and in one process."""
    ref, foreign = trainer_reference("llama")
    vpp = dict(per_device_train_batch_size=2, gradient_accumulation_steps=4, pipeline_parallel_degree=2,
               virtual_pipeline_model_parallel_size=2, finetune="own")
    launch(WORKER, 2, phase_args("llama", tmp_path / "vpp", tmp_path / "vpp_res", llama_weights,
                                 foreign_checkpoint=foreign, **vpp), tmp_path / "vpp_launch", timeout=420)
    saved = tmp_path / "vpp" / "short" / "checkpoint-3"
    for r in read_results(tmp_path / "vpp_res", 2):
        at = f"pp2_vpp2 rank {r['rank']}"
        assert_layout_claims(r, ref, at)
        assert_finetune(r, finetune_reference, at)

    resume = dict(foreign_checkpoint=saved)
    launch(WORKER, 2, phase_args("llama", tmp_path / "tp2", tmp_path / "tp2_res", llama_weights,
                                 per_device_train_batch_size=4, tensor_parallel_degree=2, finetune="own", packed=True,
                                 **resume), tmp_path / "tp2_launch", timeout=420)
    run_single(WORKER, phase_args("llama", tmp_path / "one", tmp_path / "one_res", llama_weights,
                                  per_device_train_batch_size=4, **resume))
    for r in read_results(tmp_path / "tp2_res", 2) + read_results(tmp_path / "one_res", 1):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"pp2_vpp2 checkpoint resumed by rank {r['rank']}")
    for r in read_results(tmp_path / "tp2_res", 2):
        assert_finetune(r, finetune_reference, f"tp2 rank {r['rank']}")
        assert_packed(r, packed_reference, f"tp2 rank {r['rank']}")


def test_split_param_trains_like_one_process_and_its_checkpoint_resumes_under_stage3_and_one_process(
    tmp_path, trainer_reference, llama_weights
):
    """Sharding stage1 V2 (``split_param``) ×2: the layout's claims as above (its optimizer states are flat
    slices cut anywhere in a parameter), then its step-3 checkpoint continues the one-process curve under
    sharding stage3 ×2 and in one process."""
    ref, foreign = trainer_reference("llama")
    v2 = dict(per_device_train_batch_size=2, sharding="stage1", sharding_parallel_degree=2,
              sharding_parallel_config="split_param")
    launch(WORKER, 2, phase_args("llama", tmp_path / "v2", tmp_path / "v2_res", llama_weights,
                                 foreign_checkpoint=foreign, **v2), tmp_path / "v2_launch", timeout=420)
    saved = tmp_path / "v2" / "short" / "checkpoint-3"
    for r in read_results(tmp_path / "v2_res", 2):
        assert_layout_claims(r, ref, f"s1v2x2 rank {r['rank']}")

    resume = dict(foreign_checkpoint=saved)
    launch(WORKER, 2, phase_args("llama", tmp_path / "s3", tmp_path / "s3_res", llama_weights,
                                 per_device_train_batch_size=2, sharding="stage3", sharding_parallel_degree=2,
                                 **resume), tmp_path / "s3_launch", timeout=420)
    run_single(WORKER, phase_args("llama", tmp_path / "one", tmp_path / "one_res", llama_weights,
                                  per_device_train_batch_size=4, **resume))
    for r in read_results(tmp_path / "s3_res", 2) + read_results(tmp_path / "one_res", 1):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"s1v2x2 checkpoint resumed by rank {r['rank']}")


def test_sep_trains_like_one_process_and_its_checkpoint_resumes_in_one_process_and_under_tp2_pp2_and_back(
    tmp_path, trainer_reference, finetune_reference, packed_reference, llama_weights
):
    """Sequence-segment parallel ×2 (Ulysses): the layout's claims as above — both sep ranks read the same 4
    samples per micro-batch and keep half of every sequence; the logged loss is the whole sequences' mean and the
    grad norm counts each gradient once — then its step-3 checkpoint (written by sep rank 0 alone: the sep ranks
    hold the same weights, so its files and pieces are the one-process checkpoint's) continues the one-process
    curve in one process and under tp2·pp2, and that tp2·pp2 launch's own step-3 checkpoint continues it under
    sep2 (same global batch 8 everywhere)."""
    ref, foreign = trainer_reference("llama")
    sep = dict(per_device_train_batch_size=4, sep_parallel_degree=2)
    launch(WORKER, 2, phase_args("llama", tmp_path / "sep", tmp_path / "sep_res", llama_weights,
                                 foreign_checkpoint=foreign, finetune="own", packed=True, **sep),
           tmp_path / "sep_launch", timeout=420)
    saved = tmp_path / "sep" / "short" / "checkpoint-3"
    for r in read_results(tmp_path / "sep_res", 2):
        assert_layout_claims(r, ref, f"sep2 rank {r['rank']}")
        assert_finetune(r, finetune_reference, f"sep2 rank {r['rank']}")
        assert_packed(r, packed_reference, f"sep2 rank {r['rank']}")  # the document mask travels whole
    one_writer_per_piece(read_index(str(saved)), read_index(str(foreign)))

    run_single(WORKER, phase_args("llama", tmp_path / "one", tmp_path / "one_res", llama_weights,
                                  per_device_train_batch_size=4, foreign_checkpoint=saved))
    for r in read_results(tmp_path / "one_res", 1):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, "sep2 checkpoint resumed in one process")

    launch(WORKER, 4, phase_args("llama", tmp_path / "tp2pp2", tmp_path / "tp2pp2_res", llama_weights,
                                 per_device_train_batch_size=4, tensor_parallel_degree=2,
                                 pipeline_parallel_degree=2, foreign_checkpoint=saved),
           tmp_path / "tp2pp2_launch", timeout=420)
    for r in read_results(tmp_path / "tp2pp2_res", 4):
        assert_curve(r["short"], ref["short"], 3, f"tp2pp2 rank {r['rank']} short run")
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"sep2 checkpoint resumed by tp2pp2 rank {r['rank']}")

    launch(WORKER, 2, phase_args("llama", tmp_path / "sep_b", tmp_path / "sep_b_res", llama_weights,
                                 foreign_checkpoint=tmp_path / "tp2pp2" / "short" / "checkpoint-3", **sep),
           tmp_path / "sep_b_launch", timeout=420)
    for r in read_results(tmp_path / "sep_b_res", 2):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"tp2pp2 checkpoint resumed by sep2 rank {r['rank']}")


def one_writer_per_piece(index, one_process_index, axis="sep"):
    """The sep2 (cp2) checkpoint's tensors as one process writes them: the same tensors, each one whole piece, in
    the same single model and optimizer files (one writer: rank 1 of the axis wrote no tensor data); each rank
    of the axis keeps only its own RNG stream (``..._sep00`` / ``..._sep01``; ``cp`` for cp)."""
    assert index["tensors"].keys() == one_process_index["tensors"].keys()
    for key, tensor in index["tensors"].items():
        assert len(tensor["pieces"]) == 1, (key, tensor["pieces"])

    def data_files(ix):
        return {p["file"] for t in ix["tensors"].values() for p in t["pieces"]}

    assert data_files(index) == data_files(one_process_index) == {
        "model_state.tp00_pp00.safetensors", "optimizer.tp00_pp00_shard00.safetensors"}
    assert data_files(index) <= set(index["files"])
    rng = sorted(f for f in index["files"] if f.startswith("rng_state."))
    assert rng == [f"rng_state.dp00_shard00_tp00_pp00_{axis}00.json", f"rng_state.dp00_shard00_tp00_pp00_{axis}01.json"]


def test_cp_trains_like_one_process_and_its_checkpoint_resumes_in_one_process_and_under_tp2_pp2_and_back(
    tmp_path, trainer_reference, finetune_reference, packed_reference, llama_weights
):
    """Ring context parallel ×2: the layout's claims as above — both cp ranks read the same 4 samples per
    micro-batch and keep the head/tail chunks (0, 3) and (1, 2) of every sequence; the logged loss is the whole
    sequences' mean, the grad norm counts each gradient once, eval logits come back in sequence order — then its
    step-3 checkpoint (written by cp rank 0 alone: the cp ranks hold the same weights, so its files and pieces
    are the one-process checkpoint's) continues the one-process curve in one process and under tp2·pp2, and
    that tp2·pp2 launch's own step-3 checkpoint continues it under cp2 (same global batch 8 everywhere)."""
    ref, foreign = trainer_reference("llama")
    cp = dict(per_device_train_batch_size=4, context_parallel_degree=2)
    launch(WORKER, 2, phase_args("llama", tmp_path / "cp", tmp_path / "cp_res", llama_weights,
                                 foreign_checkpoint=foreign, finetune="own", packed=True, **cp),
           tmp_path / "cp_launch", timeout=420)
    saved = tmp_path / "cp" / "short" / "checkpoint-3"
    for r in read_results(tmp_path / "cp_res", 2):
        assert_layout_claims(r, ref, f"cp2 rank {r['rank']}")
        assert_finetune(r, finetune_reference, f"cp2 rank {r['rank']}")
        assert_packed(r, packed_reference, f"cp2 rank {r['rank']}")  # the document mask travels whole
    one_writer_per_piece(read_index(str(saved)), read_index(str(foreign)), "cp")

    run_single(WORKER, phase_args("llama", tmp_path / "one", tmp_path / "one_res", llama_weights,
                                  per_device_train_batch_size=4, foreign_checkpoint=saved))
    for r in read_results(tmp_path / "one_res", 1):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, "cp2 checkpoint resumed in one process")

    launch(WORKER, 4, phase_args("llama", tmp_path / "tp2pp2", tmp_path / "tp2pp2_res", llama_weights,
                                 per_device_train_batch_size=4, tensor_parallel_degree=2,
                                 pipeline_parallel_degree=2, foreign_checkpoint=saved),
           tmp_path / "tp2pp2_launch", timeout=420)
    for r in read_results(tmp_path / "tp2pp2_res", 4):
        assert_curve(r["short"], ref["short"], 3, f"tp2pp2 rank {r['rank']} short run")
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"cp2 checkpoint resumed by tp2pp2 rank {r['rank']}")

    launch(WORKER, 2, phase_args("llama", tmp_path / "cp_b", tmp_path / "cp_b_res", llama_weights,
                                 foreign_checkpoint=tmp_path / "tp2pp2" / "short" / "checkpoint-3", **cp),
           tmp_path / "cp_b_launch", timeout=420)
    for r in read_results(tmp_path / "cp_b_res", 2):
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"tp2pp2 checkpoint resumed by cp2 rank {r['rank']}")
