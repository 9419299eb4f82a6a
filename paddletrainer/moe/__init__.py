"""Mixture of experts: :class:`~.layer.MoELayer` (dropless top-k, exact under expert parallel), the token
exchange (:mod:`.dispatch`) and the global load-balance statistics (:mod:`.stats`)."""
from .layer import MoELayer, SwiGLU
from .stats import MoEStats, summary_metrics

__all__ = ["MoELayer", "SwiGLU", "MoEStats", "summary_metrics"]
