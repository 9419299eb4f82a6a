"""What a layout costs before it is launched: the per-rank arithmetic (``memory_model``, ``cost_model``),
device profiles (``profiles``) and the layout planner (``planner.plan``, the ``paddletrainer-plan`` command)."""
from .cost_model import Config, Layout
from .memory_model import StateBytes, state_bytes_per_rank
from .planner import CALIBRATION, Calibration, Candidate, config_from_paddlenlp, plan, predict_memory, predict_time
from .profiles import PROFILES, DeviceProfile, get_profile

__all__ = ["CALIBRATION", "Calibration", "Candidate", "Config", "DeviceProfile", "Layout", "PROFILES", "StateBytes",
           "config_from_paddlenlp", "get_profile", "plan", "predict_memory", "predict_time", "state_bytes_per_rank"]
