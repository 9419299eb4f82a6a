"""What keeps a run alive and ends it cleanly: graceful SIGTERM/SIGINT stop (:mod:`.signals`), the collective hang
watchdog (:mod:`.watchdog`) and the Trainer callback that drives both (:mod:`.callback`)."""
from .callback import RobustnessCallback
from .signals import GracefulStop
from .watchdog import WATCHDOG_EXIT_CODE, CollectiveWatchdog

__all__ = ["CollectiveWatchdog", "GracefulStop", "RobustnessCallback", "WATCHDOG_EXIT_CODE"]
