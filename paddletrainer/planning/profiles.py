"""Device profiles the layout planner prices a layout on: peak compute, memory, bandwidths, the fixed process
baseline, the training dtype. Data, overridable: ``get_profile("A100-80G", peak_tflops=280)`` or a
``DeviceProfile`` of your own.

The GPU figures are the vendors' datasheet numbers (dense bf16/fp16 tensor-core TFLOPs, no sparsity) and the
bus bandwidth NCCL reaches on that interconnect (about 80% of the link's one-way rate); ``efficiency`` is the
share of peak the matmuls of a large decoder reach (model FLOPs utilisation of published runs, 40–55%). None of
the GPU rows is calibrated on a GPU here (this machine has none): docs/benchmarks.md ("Layout planner against
published runs") states how far they land from published runs. ``CPU-this-machine`` is measured here
(``scripts/bench_memory.py``: the baseline; ``cost_model.py --probe``: gloo's loopback rate).
"""
from __future__ import annotations

import dataclasses

__all__ = ["PROFILES", "DeviceProfile", "get_profile"]

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What one device of a machine can do. Bandwidths are per device, bytes/s of NCCL bus bandwidth."""

    name: str
    peak_tflops: float  # dense, in ``dtype`` (tensor cores on GPUs)
    memory_bytes: float  # usable device memory
    intra_node_bw: float  # bytes/s between devices of one node (NVLink / loopback)
    inter_node_bw: float  # bytes/s between nodes, per device (InfiniBand / Ethernet)
    devices_per_node: int
    efficiency: float  # share of peak the model's matmuls reach
    baseline_bytes: float  # per process, outside the training state: libraries, contexts, communicator buffers
    dtype: str  # the parameters' training dtype: "bfloat16" / "float16" (with fp32 masters) or "float32"
    latency_s: float = 10e-6  # per collective step (NCCL ~5-10 µs per ring step)


_GB = 1e9
PROFILES = {
    # A100 SXM 80GB: 312 TFLOPs bf16; NVLink3 300 GB/s one way, NCCL bus bandwidth ~230 GB/s; one 200 Gb/s HDR
    # HCA per GPU (25 GB/s). Baseline: CUDA context + cuBLAS/cuDNN workspaces + NCCL buffers, ~1 GiB.
    "A100-80G": DeviceProfile("A100-80G", 312.0, 80 * GIB, 230 * _GB, 23 * _GB, 8, 0.50, 1.0 * GIB, "bfloat16"),
    # H100 SXM 80GB: 989 TFLOPs bf16; NVLink4 450 GB/s one way, NCCL ~360 GB/s; 400 Gb/s NDR per GPU.
    "H100-80G": DeviceProfile("H100-80G", 989.0, 80 * GIB, 360 * _GB, 45 * _GB, 8, 0.40, 1.0 * GIB, "bfloat16"),
    # V100 SXM2 32GB: 125 TFLOPs fp16 (no bf16); NVLink2 150 GB/s one way, NCCL ~130 GB/s; 100 Gb/s EDR.
    "V100-32G": DeviceProfile("V100-32G", 125.0, 32 * GIB, 130 * _GB, 11 * _GB, 8, 0.45, 0.8 * GIB, "float16"),
    # This machine: 2 AMD EPYC vCPUs (AVX2 FMA, fp32 ~0.08 TFLOPs per core), gloo over loopback. The baseline is
    # bench_memory's measurement (imports + topology, before the model): 519-521 MiB per process on 2026-11-26
    # (559-564 MiB on 2026-11-25 20:00, before changes on main since); it moves with the libraries loaded.
    "CPU-this-machine": DeviceProfile("CPU-this-machine", 0.08, 24 * GIB / 2, 1.0 * _GB, 1.0 * _GB, 2, 0.35,
                                      520 * 2**20, "float32", latency_s=50e-6),
}


def get_profile(name, **overrides) -> DeviceProfile:
    """The profile ``name`` (a key of ``PROFILES`` or a ``DeviceProfile``) with ``overrides`` replacing fields."""
    if isinstance(name, DeviceProfile):
        base = name
    elif name in PROFILES:
        base = PROFILES[name]
    else:
        raise ValueError(f"unknown device profile {name!r}; valid: {', '.join(PROFILES)}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(DeviceProfile)}
    if unknown:
        raise ValueError(f"unknown profile field(s) {sorted(unknown)}; valid: "
                         f"{', '.join(f.name for f in dataclasses.fields(DeviceProfile))}")
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
