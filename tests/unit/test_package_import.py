"""`import paddletrainer` (and its public names) never imports paddlenlp."""
import subprocess
import sys


def test_importing_paddletrainer_and_its_public_api_does_not_import_paddlenlp():
    code = (
        "import sys, paddletrainer\n"
        "from paddletrainer import Trainer, TrainingArguments, PdArgumentParser, EarlyStoppingCallback\n"
        "import paddletrainer.parallel, paddletrainer.checkpoint, paddletrainer.metrics\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'paddlenlp'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_public_name_resolves():
    import paddletrainer

    for name in paddletrainer.__all__:
        assert getattr(paddletrainer, name) is not None
