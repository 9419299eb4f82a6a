"""Session fixtures for the distributed suite: the tiny Llama's weights and cached single-process runs."""
from __future__ import annotations

import pytest

from launcher import read_results, run_single
from trainer_phases import WORKER as PHASES, phase_args

WORKER = "train_worker.py"


@pytest.fixture(scope="session")
def llama_weights(tmp_path_factory):
    """Directory of the tiny Llama (fixed seed) that every worker loads with from_pretrained."""
    path = tmp_path_factory.mktemp("llama_weights")
    run_single("save_llama.py", [path])
    return path


@pytest.fixture(scope="session")
def single_process(tmp_path_factory, llama_weights):
    """``single_process(model, **options)`` → the reference result of one process (cached per session)."""
    cache = {}

    def get(model: str, **options):
        key = (model, tuple(sorted(options.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"single_{model}")
            args = ["--model", model, "--out", out] + _options(options)
            if model == "llama":
                args += ["--weights", llama_weights]
            run_single(WORKER, args)
            cache[key] = read_results(out, 1)[0]
        return cache[key]

    return get


def _options(options: dict) -> list:
    args = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, value]
    return args


@pytest.fixture(scope="session")
def launch_layout(tmp_path_factory, llama_weights):
    """``launch_layout(model, nproc, **layout_and_options)`` → list of per-rank results of one launch."""
    from launcher import launch

    def run(model: str, nproc: int, **options):
        work = tmp_path_factory.mktemp(f"{model}_{'_'.join(f'{k}{v}' for k, v in options.items())}")
        out = work / "out"
        args = ["--model", model, "--out", out] + _options(options)
        if model == "llama":
            args += ["--weights", llama_weights]
        launch(WORKER, nproc, args, work)
        return read_results(out, nproc)

    return run


@pytest.fixture(scope="session")
def trainer_reference(tmp_path_factory, llama_weights):
    """``trainer_reference(model)`` → (one-process result of every ``trainer_phases_worker`` phase, its step-3
    checkpoint): batch 4 × 2 accumulation steps = the layouts' global batch 8 (cached per session)."""
    cache = {}

    def get(model: str):
        if model not in cache:
            work = tmp_path_factory.mktemp(f"trainer_single_{model}")
            run_single(PHASES, phase_args(model, work / "out", work / "res", llama_weights,
                                          per_device_train_batch_size=4, direct_eval=True, uninterrupted=True,
                                          stream=True))
            cache[model] = (read_results(work / "res", 1)[0], work / "out" / "short" / "checkpoint-3")
        return cache[model]

    return get


@pytest.fixture(scope="session")
def one_micro_batch_reference(tmp_path_factory, llama_weights):
    """One process holding the whole global batch in one micro-batch: the fine-tuning phase
    (``trainer_worker.finetune_phases``, with its eval documents' token mean computed without the Trainer) and the
    packed-row phases (``packed_phases``)."""
    work = tmp_path_factory.mktemp("finetune_single")
    run_single(PHASES, phase_args("llama", work / "out", work / "res", llama_weights, per_device_train_batch_size=8,
                                  gradient_accumulation_steps=1, finetune="own", finetune_only=True, direct_eval=True,
                                  packed=True))
    return read_results(work / "res", 1)[0]


@pytest.fixture(scope="session")
def finetune_reference(one_micro_batch_reference):
    """The fine-tuning phase of :func:`one_micro_batch_reference`."""
    return one_micro_batch_reference["finetune"]


@pytest.fixture(scope="session")
def packed_reference(one_micro_batch_reference):
    """The packed-row phases of :func:`one_micro_batch_reference`; the two formats train alike."""
    ref = {name: phase for name, phase in one_micro_batch_reference.items() if name.startswith("packed_")}
    startend, block = ref["packed_startend"], ref["packed_attention_mask"]
    for key in ("losses", "grad_norms"):
        assert startend[key] == pytest.approx(block[key], rel=1e-5), key
    assert startend["eval_loss"] == pytest.approx(block["eval_loss"], rel=1e-5)
    assert len(startend["trained_tokens_per_second"]) == 3
    return ref
