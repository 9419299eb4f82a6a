"""``paddlenlp.trainer.trainer_callback``: an alias of :mod:`paddletrainer.callbacks` (same objects)."""
from .callbacks import *  # noqa: F401,F403  (the alias re-exports that module's public names)
from .callbacks import __all__  # noqa: F401
