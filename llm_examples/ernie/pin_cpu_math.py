"""Pin what would make the quick start's figures differ between machines; import it before numpy and Paddle.

Measured on the quick start (2026-11-25, 2-core AMD EPYC): with the same seed, a second run on the same
machine gives the same bits, and so do runs under ``OMP_NUM_THREADS=1`` or ``2``, ``FLAGS_paddle_num_threads=2``
or another ``PYTHONHASHSEED`` (data order and vocabulary are sorted, the sampler is seeded by ``set_seed``).
What differs is the CPU: Intel MKL, which Paddle's CPU build calls for matmuls, picks its kernels by
instruction set, and each kernel sums in its own order, so a machine with other CPU features trains a
different model (simulated with ``MKL_DEBUG_CPU_TYPE=5``: test accuracy 0.8140 instead of 0.8151). So, on import:

* ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility mode, the same kernels and results on
  every x86 CPU, Intel or not (on this AMD machine it is the path MKL took anyway, so it costs nothing here;
  on an Intel CPU with AVX-512 it can be slower). It overrides a ``MKL_CBWR`` the caller set.
* ``MKL_DEBUG_CPU_TYPE`` is removed: that undocumented switch forces a kernel family and bypasses the mode.
* ``FLAGS_paddle_num_threads=1`` (Paddle's default): MKL promises reproducibility only for a fixed thread
  count, so a caller's value is replaced rather than honoured.

What stays machine-dependent: a non-x86 CPU (no MKL: Paddle uses other kernels), another Paddle or MKL
build, and GPUs. The logistic-regression baseline uses OpenBLAS through scipy, which also picks kernels by
CPU; ``baseline.py`` converges to the unique optimum instead of pinning it (see there).
"""
import os

PINNED = {"MKL_CBWR": "COMPATIBLE", "FLAGS_paddle_num_threads": "1"}
DROPPED = ("MKL_DEBUG_CPU_TYPE",)


def pin(environ=os.environ):
    """Set the variables above in ``environ`` (the process environment: MKL and Paddle read it when they load)."""
    environ.update(PINNED)
    for name in DROPPED:
        environ.pop(name, None)


pin()
