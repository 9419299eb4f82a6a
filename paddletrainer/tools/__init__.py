"""Command-line tools shipped with the package (console scripts in pyproject.toml):
:mod:`.merge_checkpoint` (``paddletrainer-merge-checkpoint``) and :mod:`.gpu_smoke`
(``paddletrainer-gpu-smoke``). ``paddletrainer.launch`` stays at the top level (``python -m paddletrainer.launch``)."""
