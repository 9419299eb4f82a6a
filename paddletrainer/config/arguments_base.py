"""The parts of ``TrainingArguments`` that are not options: this process's ranks (they need the process groups)
and the serialization PaddleNLP scripts call (``to_dict``, ``to_json_string``, ``from_json_file``,
``print_config``). A base class of :class:`~paddletrainer.training_args.TrainingArguments`, with no fields of its own.
"""
import json
import logging
from contextlib import contextmanager
from dataclasses import asdict
from enum import Enum
from typing import Any, Dict

from ..argparser import PdArgumentParser

__all__ = ["ArgumentsRanksAndSerialization", "view"]

logger = logging.getLogger("paddletrainer.training_args")  # the arguments' logger: one place to configure

_SECRET_SUFFIXES = ("_token", "_api_key")


def view(getter, doc: str) -> property:
    """A read-only derived attribute (PaddleNLP scripts read these names as attributes)."""
    return property(getter, doc=doc)


class ArgumentsRanksAndSerialization:
    """Ranks and serialization of the training arguments (see the module docstring)."""

    # ================================================================ ranks (need the process groups)
    def _topology(self):
        # Function-level import on purpose: parallel imports training_args, not the reverse (see module doc).
        from paddletrainer.parallel.topology import init_topology

        return init_topology(self._parallel_config())

    def _rank(self, attribute: str) -> int:
        if self._parallel_config().layout.world_size == 1:
            return 0
        return getattr(self._topology(), attribute)

    process_index = view(lambda self: self._rank("rank"), "Global rank of this process.")
    local_process_index = view(lambda self: self._rank("local_rank"), "Rank of this process on its node.")
    tensor_parallel_rank = view(lambda self: self._rank("tp_rank"), "Rank in the tensor-parallel group.")
    pipeline_parallel_rank = view(lambda self: self._rank("pp_rank"), "Pipeline stage of this process.")
    sharding_parallel_rank = view(lambda self: self._rank("sharding_rank"), "Rank in the sharding group.")
    data_parallel_rank = view(lambda self: self._rank("dp_rank"), "Rank in the data-parallel group.")
    dataset_rank = view(lambda self: self._rank("data_rank"),
                         "Which data stream this process reads: dp_rank × sharding + sharding_rank.")

    @property
    def should_log(self) -> bool:
        """Process 0 logs (or the first process of each node with ``log_on_each_node``)."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        """Process 0 writes shared files (or the first process of each node with ``save_on_each_node``)."""
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    @property
    def should_load_dataset(self) -> bool:
        """Whether this process reads data: every process does, also with ``distributed_dataloader`` (see the
        module docstring: each rank reads its own share, nothing is broadcast)."""
        return True

    @contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """Run the block on the main process (of the node, with ``local``) first, then on the others.

        Used around dataset preprocessing so that one process builds the cache and the others read it.
        """
        if self.world_size == 1:
            yield
            return
        import paddle.distributed as dist

        self._topology()  # the barrier needs the process group
        is_main = (self.local_process_index if local else self.process_index) == 0
        if not is_main:
            logger.debug("process %d waits for the main process to finish %s", self.process_index, desc)
            dist.barrier()
        try:
            yield
        finally:
            if is_main:
                dist.barrier()

    # ================================================================ serialization
    def to_dict(self) -> Dict[str, Any]:
        """All fields as plain values (enums → their strings); secrets (``*_token``, ``*_api_key``) masked."""
        result = {}
        for key, value in asdict(self).items():
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, list):
                value = [v.value if isinstance(v, Enum) else v for v in value]
            if key.endswith(_SECRET_SUFFIXES) and value is not None:
                value = f"<{key.upper()}>"
            result[key] = value
        return result

    def to_json_string(self) -> str:
        """``to_dict()`` as indented JSON (what a checkpoint stores as ``training_args.json``)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_sanitized_dict(self) -> Dict[str, Any]:
        """``to_dict()`` plus the batch sizes, with every value a bool/int/float/str (for metric loggers)."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}

    @classmethod
    def from_json_file(cls, json_file: str):
        """Load arguments written by ``to_json_string`` (or any PaddleNLP-style JSON config).

        Masked secrets come back unset. The result is re-validated against the current launch environment.
        """
        with open(json_file) as f:
            data = json.load(f)
        data = {k: v for k, v in data.items() if not (k.endswith(_SECRET_SUFFIXES) and v == f"<{k.upper()}>")}
        return PdArgumentParser(cls).parse_dict(data)[0]

    def print_config(self, args: Any = None, key: str = "") -> None:
        """Log every field of ``args`` (default: these training arguments) under a "<key> Configuration" title;
        PaddleNLP scripts call it for their model and data arguments too."""
        if args is None:
            args, key = self, "Training"
        values = args.to_dict() if hasattr(args, "to_dict") else vars(args)
        lines = [f"{'=' * 60}", f"{key + ' Configuration Arguments':^60}"]
        lines += [f"{name:40}: {value}" for name, value in sorted(values.items())]
        logger.info("\n".join(lines))
