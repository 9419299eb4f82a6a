"""``paddlenlp.trainer.utils.helper``: the nested-output helpers (:mod:`paddletrainer.data.nested`) and the
broadcasts of a loaded state across ranks and nodes (:mod:`paddletrainer.parallel.broadcast`), re-exported."""
from ..data.nested import (
    distributed_concat,
    nested_concat,
    nested_detach,
    nested_numpify,
    nested_truncate,
    numpy_pad_and_concatenate,
    paddle_pad_and_concatenate,
)
from ..parallel.broadcast import (
    broadcast_dataset_rank0_model,
    broadcast_dp_optimizer,
    broadcast_moe_optimizer,
    distributed_file,
    distributed_isfile,
)

__all__ = ["distributed_concat", "nested_concat", "nested_detach", "nested_numpify", "nested_truncate",
           "paddle_pad_and_concatenate", "numpy_pad_and_concatenate", "distributed_file", "distributed_isfile",
           "broadcast_dp_optimizer", "broadcast_moe_optimizer", "broadcast_dataset_rank0_model"]
