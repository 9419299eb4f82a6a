"""The gloo fills: what Paddle's CPU build lacks for hybrid parallelism, filled exactly and only on that build.

Installed once per process by :func:`paddletrainer.parallel.topology.init_topology` on a CPU-only build
(:func:`.backend.install`); each fill names the Paddle function it replaces, and
:func:`.backend.check_paddle_assumptions` fails if Paddle changed what a fill patches. Only a CPU-build
maintainer needs this package; the axes in :mod:`paddletrainer.parallel` do not depend on it on a GPU.
"""
