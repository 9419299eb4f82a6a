"""Command-line tools shipped with the package (console scripts in pyproject.toml):
:mod:`.merge_checkpoint` (``paddletrainer-merge-checkpoint``), :mod:`.gpu_smoke` (``paddletrainer-gpu-smoke``),
:mod:`.build_pretrain_data` (``paddletrainer-build-pretrain-data``) and :mod:`.export_paddlenlp_unified`
(``paddletrainer-export-paddlenlp-unified``). ``paddletrainer.launch`` stays at the top level (``python -m paddletrainer.launch``)."""
