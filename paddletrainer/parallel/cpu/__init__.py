"""The gloo fills: CPU-build replacements for collectives and kernels Paddle's CPU build lacks."""
