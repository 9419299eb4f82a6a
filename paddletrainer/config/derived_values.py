"""The values ``TrainingArguments`` derives from its options, as read-only attributes: the typed config of each
subsystem (``parallel_config``, ``amp_config``, ``rollback_config``, ``replica_check_config``, ``metrics_config``),
PaddleNLP's thin views of the parallel config (``parallel_degrees``, ``sharding_stage``, ``*_parallel_options``,
``world_size`` ...), the batch sizes, and the warmup and decay steps of the LR schedule.

A base class of :class:`~paddletrainer.training_args.TrainingArguments`, with no fields of its own: it reads the
options by their names and ``TrainingArguments._parallel_config()`` (the layout checked at construction, rebuilt
when a script changed a field it is built from) and ``_unified_checkpoint_options`` (set at construction).
Paddle-free.
"""
import math

from .arguments_base import view
from .builders import amp_settings_of, metrics_config_of, replica_check_config_of, rollback_config_of

__all__ = ["DerivedValues"]


class DerivedValues:
    """Derived values of the training arguments (see the module docstring)."""

    parallel_config = view(lambda self: self._parallel_config(), "The typed :class:`ParallelConfig` the parallel "
                           "package takes; rebuilt and re-checked when a field it is built from has changed.")
    amp_config = view(amp_settings_of, "The mixed precision asked for (``config.builders.AmpSettings``).")
    rollback_config = view(rollback_config_of, "``config.builders.RollbackConfig``; None unless nan_inf_policy='rollback'.")
    replica_check_config = view(replica_check_config_of, "``config.builders.ReplicaCheckConfig`` (replica_check_steps).")
    metrics_config = view(metrics_config_of, "``config.builders.MetricsConfig``: the writers, logging_dir, run_name.")
    parallel_degrees = view(lambda self: self.parallel_config.layout, "The resolved :class:`Layout`.")
    use_hybrid_parallel = view(lambda self: self.parallel_config.layout.use_hybrid,
                               "PaddleNLP's flag: sharding, tensor or pipeline parallel is active.")
    data_parallel_degree = view(lambda self: self.parallel_config.layout.dp, "The resolved data-parallel degree "
                                "(PaddleNLP sets this attribute in ``__post_init__``).")
    sharding_stage = view(lambda self: self.parallel_config.sharding_stage, "0 when sharding is off, else 1, 2 or 3.")
    sharding_offload = view(lambda self: self.parallel_config.sharding_offload,
                            "Whether sharded state is kept in host memory.")
    pipeline_parallel_options = view(lambda self: self.parallel_config.pipeline_options,
                                     "The names given in ``pipeline_parallel_config`` (a frozenset).")
    sharding_parallel_options = view(lambda self: self.parallel_config.sharding_options,
                                     "The names given in ``sharding_parallel_config`` (a frozenset).")
    tensor_parallel_options = view(lambda self: self.parallel_config.tensor_options,
                                   "The names given in ``tensor_parallel_config`` (a frozenset).")
    unified_checkpoint_options = view(lambda self: self._unified_checkpoint_options, "The names given in "
                                      "``unified_checkpoint_config`` (empty unless ``unified_checkpoint``).")
    train_batch_size = view(lambda self: self.per_device_train_batch_size,
                            "Samples per process per micro-step (as PaddleNLP: ``per_device_train_batch_size``).")
    eval_batch_size = view(lambda self: self.per_device_eval_batch_size,
                           "Samples per process per evaluation step.")
    global_batch_size = view(lambda self: self.per_device_train_batch_size * self.gradient_accumulation_steps
                             * self.dataset_world_size,
                             "Samples per optimizer step over all processes: batch × accumulation × dp × sharding.")
    world_size = view(lambda self: self.parallel_config.layout.world_size,
                      "Number of processes (from the launch environment; equals the topology's).")
    dataset_world_size = view(lambda self: self.parallel_config.layout.data_world_size,
                              "Number of distinct data streams: dp × sharding (tensor/pipeline ranks share one).")

    def schedule_decay_steps(self, num_training_steps: int) -> int:
        """Steps the LR schedule decays over: PaddleNLP's llm scripts add a ``decay_steps`` option to their own
        arguments class (read here when a subclass has it and it is set), else ``num_training_steps``."""
        return getattr(self, "decay_steps", 0) or num_training_steps

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """``warmup_steps`` if set, else ``ceil(warmup_ratio × num_training_steps)``."""
        if self.warmup_steps > 0:
            return self.warmup_steps
        return math.ceil(num_training_steps * self.warmup_ratio)
