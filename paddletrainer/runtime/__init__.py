"""What keeps a run alive and reproducible.

* :mod:`.signals` (graceful SIGTERM/SIGINT stop), :mod:`.watchdog` (collective hang watchdog) and
  :mod:`.callback` (the Trainer callback that drives both);
* :mod:`.rollback` (``nan_inf_policy=rollback``) and :mod:`.replica_check` (replicas stay bit-identical);
* :mod:`.seeding` (``set_seed``) and :mod:`.paddle_requirement` (the Paddle install check ``import paddletrainer``
  arms). Which build and device this is lives below ``parallel/``, in :mod:`paddletrainer.device`.

The names below resolve on first use (a literal table): ``import paddletrainer`` imports
``runtime.paddle_requirement`` before Paddle may be imported at all, so this package must not import its
paddle-importing modules eagerly.
"""
from typing import TYPE_CHECKING

from ..lazy_exports import lazy_attributes

_NAMES = {
    "RobustnessCallback": "callback",
    "GracefulStop": "signals",
    "CollectiveWatchdog": "watchdog",
    "WATCHDOG_EXIT_CODE": "watchdog",
}

if TYPE_CHECKING:  # the same names for type checkers and editors' go-to-definition (never executed)
    from .callback import RobustnessCallback
    from .signals import GracefulStop
    from .watchdog import CollectiveWatchdog, WATCHDOG_EXIT_CODE

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_attributes(globals(), _NAMES)
