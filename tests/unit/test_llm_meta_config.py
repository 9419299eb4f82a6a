"""PaddleNLP's llm scripts decorate their ``TrainingArguments`` subclass with ``llmmetaclass``, which adds each
``LlmMetaConfig`` option (``virtual_pp_degree``, ``use_flash_attention``, ``recompute_granularity`` ...) only when
the class has no attribute of that name. Our ``TrainingArguments`` must have exactly the attributes PaddleNLP's has
among those names, or a script's config that sets one fails ("unknown option(s) virtual_pp_degree").

The last tests run PaddleNLP's real ``llm/run_pretrain.py`` (not in the paddlenlp wheel) with every option set,
and with ``--sep_parallel_degree 2`` / ``--context_parallel_degree 2`` on 2 processes: they need
``PADDLENLP_LLM_DIR`` = a directory holding PaddleNLP's ``run_pretrain.py`` (see docs/paddlenlp_compat.md).
"""
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from paddletrainer import PdArgumentParser, TrainingArguments

configuration_utils = pytest.importorskip("paddlenlp.transformers.configuration_utils")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLM_META_NAMES = [name for name, *_ in configuration_utils.LlmMetaConfig._get_all_meta()]
# A value for every LlmMetaConfig option a script's TrainingArguments has (tensor_parallel_rank is a property of
# both TrainingArguments, never an option); non-defaults where a one-process CPU run allows them.
EVERY_LLM_META_OPTION = {
    "use_flash_attention": False, "use_fused_rms_norm": False, "use_fused_rope": False, "use_fused_linear": False,
    "use_fused_dropout_add": False, "use_fused_linear_cross_entropy": False, "tensor_parallel_degree": 1,
    "tensor_parallel_output": False, "pipeline_parallel_degree": 1, "virtual_pp_degree": 1,
    "no_recompute_layers": [1], "pp_recompute_interval": 1, "sep_parallel_degree": 1, "context_parallel_degree": 1,
    "sequence_parallel": False, "fuse_sequence_parallel_allreduce": False, "recompute": True,
    "recompute_granularity": "full", "recompute_use_reentrant": False, "refined_recompute": "",
    "offload_recompute_inputs": False,
}


def test_llm_meta_names_are_attributes_here_exactly_when_they_are_in_paddlenlp():
    from paddlenlp.trainer import TrainingArguments as PaddleNLPTrainingArguments

    assert set(EVERY_LLM_META_OPTION) == set(LLM_META_NAMES) - {"tensor_parallel_rank"}
    differ = [n for n in LLM_META_NAMES if hasattr(TrainingArguments, n) != hasattr(PaddleNLPTrainingArguments, n)]
    assert differ == []
    assert not hasattr(TrainingArguments, "virtual_pp_degree")


def test_an_llmmetaclass_subclass_parses_a_json_config_setting_every_llm_meta_option(tmp_path, monkeypatch):
    @dataclass
    @configuration_utils.llmmetaclass
    class PreTrainingArguments(TrainingArguments):
        pass

    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps({"output_dir": str(tmp_path / "out"), **EVERY_LLM_META_OPTION}))
    monkeypatch.setattr(sys, "argv", ["run_pretrain.py", str(config)])
    (args,) = PdArgumentParser(PreTrainingArguments).parse_json_file_and_cmd_lines()
    parsed = {**EVERY_LLM_META_OPTION, "refined_recompute": {}}  # parsed into a dict, as in PaddleNLP
    for name, value in parsed.items():
        assert getattr(args, name) == value, name
    assert args.parallel_config.virtual_pp_degree == 1  # our option, virtual_pipeline_model_parallel_size, unset


def _token_files(data_dir):
    """The bundled corpus as a token file in PaddleNLP's mmap format (what run_pretrain.py reads)."""
    from paddlenlp.data.indexed_dataset import make_builder

    tokens = os.path.join(ROOT, "llm_examples", "llama", "data", "tokens")
    ids, idx = np.load(os.path.join(tokens, "corpus.ids.npy")), np.load(os.path.join(tokens, "corpus.idx.npy"))
    builder = make_builder(str(data_dir / "corpus.bin"), "mmap", np.uint16)
    for d in range(len(idx) - 1):
        builder.add_item(ids[idx[d]:idx[d + 1]])
        builder.end_document()
    builder.finalize(str(data_dir / "corpus.idx"))


def _step_losses(script, config, out_dir, cwd, nproc=1):
    """The logged step losses of ``script`` run on ``config``; ``nproc`` > 1: under paddle.distributed.launch,
    behind the machine-wide lock of every multi-process launch, read from rank 0's log."""
    config = {**config, "output_dir": str(out_dir)}
    path = out_dir.parent / f"{out_dir.name}.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, str(script), str(path)]
    if nproc > 1:
        for key in [k for k in env if k.startswith("PADDLE_")]:
            del env[key]
        logs = out_dir.parent / f"{out_dir.name}_logs"
        command = ["flock", "/tmp/paddletrainer-mp.lock", "timeout", "600", sys.executable, "-m",
                   "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", str(logs), *command[1:]]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    rank0 = logs / "workerlog.0" if nproc > 1 else None
    log = rank0.read_text() if rank0 and rank0.exists() else proc.stdout + proc.stderr
    assert proc.returncode == 0, (proc.stderr + log)[-3000:]
    return [float(v) for v in re.findall(r"\bloss: ([0-9.]+), learning_rate", log)]


def _run_pretrain_setup(tmp_path):
    """PaddleNLP's run_pretrain.py, our copy of it (its Trainer imports from paddletrainer), the token files and
    the tiny Llama's config (docs/paddlenlp_compat.md's command)."""
    theirs = os.path.join(os.environ["PADDLENLP_LLM_DIR"], "run_pretrain.py")
    source = open(theirs).read()
    ours = tmp_path / "ours" / "run_pretrain.py"
    ours.parent.mkdir()
    ours.write_text(source.replace("from paddlenlp.trainer import", "from paddletrainer import"))
    data = tmp_path / "data"
    data.mkdir()
    _token_files(data)
    config = {
        "model_name_or_path": os.path.join(ROOT, "llm_examples", "llama", "tiny_llama"), "input_dir": str(data),
        "max_seq_length": 64, "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2,
        "gradient_accumulation_steps": 2, "max_steps": 4, "logging_steps": 1, "learning_rate": 1e-3,
        "warmup_steps": 0, "device": "cpu", "split": "949,50,1", "save_steps": 100, "eval_steps": 2,
        "do_train": True, "seed": 42, "unified_checkpoint": False, "report_to": "none",
        "overwrite_output_dir": True, "disable_tqdm": True,
    }
    return theirs, ours, config


NEEDS_LLM_DIR = pytest.mark.skipif(not os.environ.get("PADDLENLP_LLM_DIR"),
                                   reason="PADDLENLP_LLM_DIR (PaddleNLP's llm/) not set")


@NEEDS_LLM_DIR
def test_paddlenlps_run_pretrain_with_every_llm_meta_option_trains_as_under_paddlenlp(tmp_path):
    theirs, ours, config = _run_pretrain_setup(tmp_path)
    config.update(EVERY_LLM_META_OPTION)
    expected = _step_losses(theirs, config, tmp_path / "nlp", os.path.dirname(theirs))
    got = _step_losses(ours, config, tmp_path / "ours_out", os.path.dirname(theirs))
    assert len(expected) == 4
    assert got == expected


# cp: Llama runs ring attention only on its flash-attention path (ours on the CPU build); PaddleNLP's own sep2 and
# cp2 fail on CPU (gloo has no all_to_all; its ring attention's batch_isend_irecv times out), so the reference is
# PaddleNLP's one-process run
@NEEDS_LLM_DIR
@pytest.mark.parametrize("options", [{"sep_parallel_degree": 2},
                                     {"context_parallel_degree": 2, "use_flash_attention": True}],
                         ids=["sep2", "cp2"])
def test_paddlenlps_run_pretrain_under_sep2_and_cp2_trains_as_paddlenlp_in_one_process(tmp_path, options):
    theirs, ours, config = _run_pretrain_setup(tmp_path)
    expected = _step_losses(theirs, config, tmp_path / "nlp", os.path.dirname(theirs))
    got = _step_losses(ours, {**config, **options}, tmp_path / "ours_out", os.path.dirname(theirs), nproc=2)
    assert len(expected) == 4
    assert got == pytest.approx(expected, rel=1e-5)
