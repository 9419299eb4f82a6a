"""Markers from where a test lives (docs/testing.md: select the part you changed), and the run's launch summary.

* ``launch``: every test under tests/distributed (each starts ``paddle.distributed.launch`` or compares with
  one); elsewhere a test that launches carries ``@pytest.mark.launch`` itself;
* ``examples``: tests/examples; ``packaging``: tests/packaging; ``docs``: tests/docs;
* ``dp``, ``sharding``, ``tp``, ``pp``, ``sp``: the axes a test is about, from its file (:data:`AXES_BY_FILE`) or,
  for a test parametrized by layout, from the layout's name in its id (``llama-dp2_s1x2_tp2_pp2``);
* ``checkpoint``, ``moe``, ``ep``, ``sep``, ``cp``: a test's subject, from its file's name (:data:`SUBJECTS_BY_NAME`)
  or its layout id (``ep2``, ``sep2``, ``cp2``);
* ``smoke``: the three launches of :data:`SMOKE` (dp2, stage2×2, tp2·pp2), a layout check in minutes;
* ``full_matrix``: set by test_trainer_matrix.py on the layouts only the full matrix runs.

The markers are registered in pyproject.toml ([tool.pytest.ini_options]); ``--strict-markers`` works.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load_hang_retry():
    """tests/distributed/hang_retry.py as the module ``hang_retry``, the one the launchers import (its counts)."""
    if "hang_retry" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hang_retry", HERE / "distributed" / "hang_retry.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["hang_retry"] = module
    return sys.modules["hang_retry"]


hang_retry = _load_hang_retry()

DIRECTORY_MARKERS = {"distributed": ("launch",), "examples": ("examples",), "packaging": ("packaging",), "docs": ("docs",)}
# files about some axes whose tests are not parametrized by a layout name
AXES_BY_FILE = {
    "test_data_parallel_and_sharding.py": ("dp", "sharding"),
    "test_stage3_gradient_reduce_scatter.py": ("sharding",),
    "test_checkpoint_split_param.py": ("sharding",),
    "test_stage3_paddle_source_check.py": ("sharding",),
    "test_tensor_and_pipeline.py": ("tp", "pp"),
    "test_checkpoint_manual_tp.py": ("tp",),
    "test_fused_tensor_parallel.py": ("tp",),
    "test_sequence_parallel.py": ("sp", "tp"),
    "test_pp2_no_host_reads_between_logging_steps.py": ("pp",),
    "test_pipeline_eval_broadcast.py": ("pp",),
    "test_pipeline_virtual_split.py": ("pp",),
    "test_pipeline_default_inputs.py": ("pp",),
    "test_tensor_parallel_model_checks.py": ("tp",),
    "test_cpu_backend_interleave.py": ("pp",),
    "test_hybrid_4d.py": ("dp", "sharding", "tp", "pp"),
}
# a layout name's parts (split at "-" and "_") -> axis
AXIS_TOKENS = [
    (re.compile(r"dp\d+"), "dp"),
    (re.compile(r"(s\d(v2)?x\d+|sharding|stage\d)"), "sharding"),
    (re.compile(r"tp\d+"), "tp"),
    (re.compile(r"v?pp\d+"), "pp"),
    (re.compile(r"sp"), "sp"),
    (re.compile(r"sep\d+"), "sep"),
    (re.compile(r"cp\d+"), "cp"),
    (re.compile(r"ep\d+"), "ep"),
]
# a test file's name -> the subject markers it carries (checkpoint, moe/ep, sep, cp), wherever the file lives
SUBJECTS_BY_NAME = [
    (re.compile(r"checkpoint|ckpt|resume|reshard|rollback|unified|snapshot|lora"), ("checkpoint",)),
    (re.compile(r"moe|expert"), ("moe", "ep")),
    (re.compile(r"sep_|segment|long_context"), ("sep",)),
    (re.compile(r"context_parallel|ring_attention|long_context"), ("cp",)),
]
# the smoke set: one launch each of dp2, sharding stage2×2 and tp2·pp2 (`-m smoke`, docs/testing.md)
SMOKE = {
    "tests/distributed/test_data_parallel_and_sharding.py::test_dp2_loss_and_grad_norm_match_single_process",
    "tests/distributed/test_data_parallel_and_sharding.py::"
    "test_sharding_stage2_x2_matches_single_process_and_halves_optimizer_state",
    "tests/distributed/test_tensor_and_pipeline.py::test_tp2_pp2_loss_matches_single_process",
}


def axes_of(item) -> set:
    """The parallel axes and subjects ``item`` is about: its file's (listed, or from its name), plus those its
    parametrization id names."""
    name = Path(str(item.fspath)).name
    axes = set(AXES_BY_FILE.get(name, ()))
    axes.update(m for pattern, markers in SUBJECTS_BY_NAME if pattern.search(name) for m in markers)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and Path(str(item.fspath)).parent.name == "distributed":
        for token in re.split(r"[-_\[\]]", callspec.id):
            axes.update(axis for pattern, axis in AXIS_TOKENS if pattern.fullmatch(token))
    return axes


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(HERE).parts
        for name in DIRECTORY_MARKERS.get(parts[0], ()):
            item.add_marker(name)
        for axis in sorted(axes_of(item)):
            item.add_marker(axis)
        if f"tests/{'/'.join(parts)}::{item.name}" in SMOKE:
            item.add_marker("smoke")


def pytest_terminal_summary(terminalreporter):
    if hang_retry.LAUNCHES:
        terminalreporter.write_line(hang_retry.summary())
