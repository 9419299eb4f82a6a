"""The Trainer: train / evaluate / predict for any ``paddle.nn.Layer``, on any parallel layout.

A run, in order (``train``):
    topology (fleet.init once) → seed → dataloader (layout-free order) → optimizer + schedule → AMP →
    parallelize (one function per axis) → resume → loop → save.

One optimizer step = ``gradient_accumulation_steps`` micro-batches. The step function is chosen once: the
pipeline schedule (1F1B inside ``parallel.pipeline.train_batch``) under pipeline parallel, otherwise
forward/backward per micro-batch with gradient sync deferred to the last one. Everything after the
backward — clip, NaN policy, optimizer, schedule, callbacks, logging, saving — is the same for every layout.

Override points (PaddleNLP/HF names, all methods of ``Trainer``): compute_loss, training_step, log here;
create_optimizer, create_scheduler, create_optimizer_and_scheduler, set_optimizer_grouped_parameters in
``trainer_optimizer``; the data loaders and samplers in ``trainer_data``; evaluate, predict, evaluation_loop, prediction_step in ``trainer_evaluation``; checkpoints,
save_model, save_state, export_model in ``trainer_checkpoints``; log_metrics, save_metrics, metrics_format,
log_trained_tokens in ``metrics.results``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import paddle

from . import checkpoint as ckpt
from . import checks
from .optim import overflow
from .optim.amp import AmpConfig
from .checkpoint.peft import peft_type
from .trainer_callback import (CallbackHandler, DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainerCallback,
                               TrainerControl, TrainerState)
from .runtime.callback import RobustnessCallback
from .data.collate import DataCollatorWithPadding, default_data_collator
from .data.loader import close_batches
from .data.sampling import GlobalBatchSampler
from .errors import NonFiniteLossError, ReplicaDivergenceError  # noqa: F401 (public here as paddletrainer.trainer.*)
from .trainer_evaluation import TrainerEvaluation
from .trainer_data import TrainerData
from .trainer_optimizer import TrainerOptimizer
from .metrics.process_memory import MemoryTracker
from .metrics import (PhaseTimers, ThroughputMeter, flops_per_token_of_model, metrics_output_callbacks, peak_memory_bytes,
                      reporting_callbacks)
from .metrics.results import TrainerResults
from .metrics.startup import StartupTimer, report_startup
from .metrics.writers import check_report_to
from .optim.loss import batch_loss, scale_micro_batch_loss
from .parallel import init_topology, no_sync, parallelize, pipeline, wrap_captures_accumulation
from .parallel.clipping import GradientClip, check_gradient_clip, clip_named_gradients, take_gradient_clip
from .parallel.expert import check_expert_model
from .parallel.lazy_init import check_lazy_model, start_lazy_model
from .parallel.apply import enable_recompute  # noqa: F401 (public here as paddletrainer.trainer.enable_recompute)
from .trainer_utils import EvalPrediction, TrainOutput, speed_metrics
from .device import resolve_device
from .runtime.seeding import set_seed
from .runtime.signals import GracefulStop, check_interval
from .trainer_checkpoints import TrainerCheckpoints
from .trainer_loop_state import LoopState
from .training_args import TrainingArguments

logger = logging.getLogger(__name__)
_IMPORTS_DONE = time.time()  # the end of the startup report's "import" phase

# PaddleNLP's names. Every Trainer starts with these callbacks (RobustnessCallback: graceful SIGTERM/SIGINT
# stop and the collective watchdog), then one reporting callback per ``report_to`` name, then the user's, and
# last the progress bar (PrinterCallback with ``disable_tqdm``) -- PaddleNLP's order.
DEFAULT_CALLBACKS = [DefaultFlowCallback, RobustnessCallback]
DEFAULT_PROGRESS_CALLBACK = ProgressCallback


class Trainer(TrainerData, TrainerOptimizer, TrainerEvaluation, TrainerCheckpoints, TrainerResults):
    """Train, evaluate and predict with a Paddle model (PaddleNLP's ``Trainer`` API).

    Args:
        model: a ``paddle.nn.Layer`` whose ``forward`` takes the batch's keys and returns ``(loss, ...)``,
            a dict with ``"loss"``, or logits when ``criterion`` is given. A ``PipelineLayer`` under pipeline
            parallel.
        criterion: ``loss = criterion(logits, labels)`` for models that return logits.
        args: ``TrainingArguments``, never changed (the device run on is ``effective_device``); defaults to
            ``output_dir="tmp_trainer"``.
        data_collator: turns a list of samples into a batch; default ``DataCollatorWithPadding(tokenizer)``
            when a tokenizer is given, else ``default_data_collator``.
        train_dataset: map-style (``__len__``/``__getitem__``) or iterable dataset to train on.
        eval_dataset: the same, for ``evaluate()``.
        compute_metrics: ``EvalPrediction -> dict`` for evaluate/predict.
        callbacks: extra ``TrainerCallback`` classes or instances.
        optimizers: ``(optimizer, lr_scheduler)`` to use instead of the ones built from ``args``.
        preprocess_logits_for_metrics: ``(logits, labels) -> logits`` applied per batch before gathering.
        model_init: builds the model (called after seeding) when ``model`` is None.
    """

    def __init__(
        self,
        model: Optional[paddle.nn.Layer] = None,
        criterion: Optional[Callable] = None,
        args: Optional[TrainingArguments] = None,
        data_collator: Optional[Callable] = None,
        train_dataset=None,
        eval_dataset=None,
        tokenizer=None,
        compute_metrics: Optional[Callable[[EvalPrediction], Dict]] = None,
        callbacks: Optional[List[Union[TrainerCallback, type]]] = None,
        optimizers: Tuple[Any, Any] = (None, None),
        preprocess_logits_for_metrics: Optional[Callable] = None,
        model_init: Optional[Callable[[], paddle.nn.Layer]] = None,
    ):
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        this = weakref.ref(self)  # a strong one would keep a dropped Trainer alive until the cycle collector runs
        self.args, self._startup = args, StartupTimer(_IMPORTS_DONE, lambda values: report_startup(values, this()))
        self.effective_device = resolve_device(args.device)  # gpu on a CPU-only build: cpu (warned); args unchanged
        if args.use_cpu:  # Hugging Face's option: the CPU even when an accelerator is there (before the checks)
            paddle.set_device("cpu")
        self._memory = MemoryTracker(enabled=not args.skip_memory_metrics)
        self._memory.start("init")  # reported with the first train/evaluate/predict (PaddleNLP's init_mem_* keys)
        # Checks that need no process group come first, so bad input never leaves a half-built job.
        self.amp = AmpConfig.for_device(args.amp_config)  # raises on CPU for fp16/bf16 unless a dry run was asked for
        self._check_inputs_before_groups(model, optimizers[0])
        self.topology = init_topology(args.parallel_config)  # the one place groups are created (idempotent)
        self._startup.topology_built(self.topology.build_seconds)
        package_logger, level = logging.getLogger("paddletrainer"), args.get_process_log_level()  # HF's log_level
        if level != package_logger.getEffectiveLevel():  # "passive" (the main process's default) changes nothing
            package_logger.setLevel(level)
        set_seed(args.seed)  # a LazyGuard model draws its slices from here (as if built now; the stream rewound)
        start_lazy_model(model, self.topology, args.parallel_config, rewind_rng=True)
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model or a model_init function")
            model = model_init()
            peft_type(model)
            start_lazy_model(model, self.topology, args.parallel_config, rewind_rng=False,  # as built eagerly
                             weights_cast=self.amp.enabled and self.amp.level == "O2")
        if args.recompute:
            enable_recompute(model)
        self.model = self.model_wrapped = model
        self.criterion = criterion
        self.tokenizer = tokenizer
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        if data_collator is None:
            data_collator = DataCollatorWithPadding(tokenizer) if tokenizer is not None else default_data_collator
        self.data_collator = data_collator
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self._optimizer_built_here = False  # create_optimizer sets it: then max_grad_norm is the clip
        self.optimizer_grouped_parameters = None  # set_optimizer_grouped_parameters: what create_optimizer trains
        self.gradient_clip, self.scaler = None, None  # a GradientClip, taken off the optimizer when it is wrapped
        self.label_names = list(args.label_names) if args.label_names else ["labels"]
        self._is_pipeline = self.topology.pp_degree > 1
        self._wrapped = False
        self._wrapped_accumulation: Optional[int] = None  # the GA the wrapped model counts in, when it counts
        self._checkpointer = ckpt.Checkpointer(lambda: this()._checkpoint_states())  # what it saves: read at each save
        self._loop: Optional[LoopState] = None  # the running state of a train() call, fresh for each call
        self.state = TrainerState(is_local_process_zero=self.topology.local_rank == 0,
                                  is_world_process_zero=self.topology.rank == 0)
        self.control = TrainerControl()
        self._stop = GracefulStop()  # asked by the loop after each optimizer step; RobustnessCallback installs it
        self.callback_handler = CallbackHandler(
            self._default_callbacks(criterion) + list(callbacks or []), self.model, self.tokenizer, self.optimizer,
            self.lr_scheduler, metrics_output_callbacks(args.metrics_output_path, self.topology.rank))
        self.add_callback(PrinterCallback if args.disable_tqdm else DEFAULT_PROGRESS_CALLBACK)
        self.timers = PhaseTimers(enabled=args.log_phase_timers)
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        self._memory.stop("init")
        self._startup.mark("model")

    def _check_inputs_before_groups(self, model, optimizer) -> None:
        """The construction checks that need no process group: the model against the layout, its PEFT type, the
        logging backends and a user optimizer against the layout (each a one-line error naming the option)."""
        if model is not None:
            checks.check_model_for_layout(model, self.args.parallel_degrees)
            peft_type(model)  # a PEFT type or LoRA option whose saves would be wrong is refused by name
            check_lazy_model(model, self.args.parallel_config, self.amp.enabled and self.amp.level == "O2")
            degrees = self.args.parallel_degrees
            check_expert_model(model, degrees.ep, self.args.parallel_config.sequence_parallel and degrees.tp > 1,
                               staged=degrees.pp > 1)
        check_report_to(self.args.report_to)  # unknown names and missing writer libraries, before any group exists
        if optimizer is not None:
            checks.check_optimizer_for_layout(optimizer, self.args.parallel_config)

    def _default_callbacks(self, criterion) -> list:
        """PaddleNLP's defaults (flow control, the robustness callback built for this run), then ``report_to``'s."""
        args = self.args
        robustness = RobustnessCallback(self.topology, args.collective_timeout_seconds,
                                        popped_keys=self.label_names if criterion is not None else (),
                                        stopper=self._stop, remove_unused_columns=args.remove_unused_columns)
        defaults = [robustness if cb is RobustnessCallback else cb for cb in DEFAULT_CALLBACKS]
        return defaults + reporting_callbacks(args.report_to)

    # ----------------------------------------------------------------------------------- process identity
    def is_world_process_zero(self) -> bool:
        """Whether this is the global rank 0 process (the one that writes logs and shared files)."""
        return self.topology.rank == 0

    def is_local_process_zero(self) -> bool:
        """Whether this is rank 0 on its node."""
        return self.topology.local_rank == 0

    # ----------------------------------------------------------------------------------- callbacks
    def add_callback(self, callback):
        """Add a callback (class or instance)."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        """Remove and return a callback (class or instance); None if absent."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback):
        """Remove a callback (class or instance)."""
        self.callback_handler.remove_callback(callback)

    def _wrap_model_and_optimizer(self):
        """AMP decoration first (it casts weights the parallel wrappers then shard), then the parallel axes."""
        if self._wrapped:
            return
        self.amp.warn_if_dry_run()
        self.gradient_clip = self._take_gradient_clip()
        self.model, self.optimizer = self.amp.decorate(self.model, self.optimizer)
        self.scaler = self.amp.grad_scaler()
        config = self.args.parallel_config
        self.model_wrapped, self.optimizer = parallelize(self.model, self.optimizer, self.topology, config,
                                                         timed=self._startup.timed)
        if wrap_captures_accumulation(self.topology, config):
            self._wrapped_accumulation = config.accumulate_steps
        self.callback_handler.model = self.model
        self.callback_handler.optimizer = self.optimizer
        self.callback_handler.lr_scheduler = self.lr_scheduler
        self._wrapped = True

    def _take_gradient_clip(self) -> GradientClip:
        """The clip the step applies, PaddleNLP's rule: the optimizer the Trainer builds clips by the global norm
        at ``max_grad_norm``; an optimizer the user built (``optimizers=`` or a ``create_optimizer`` override)
        clips with its own ``grad_clip``, per parameter group as Paddle does, or not at all."""
        checks.check_optimizer_for_layout(self.optimizer, self.args.parallel_config)
        if self._optimizer_built_here:
            clip = GradientClip.global_norm(self.args.max_grad_norm)
        else:
            clip = take_gradient_clip(self.optimizer)
            if not clip.groups and self.args.max_grad_norm and self.args.max_grad_norm > 0:
                logger.warning("the optimizer given to the Trainer has no grad_clip: gradients are not clipped "
                               "(max_grad_norm=%s applies to the optimizer the Trainer builds, as in PaddleNLP); "
                               "build yours with grad_clip=paddle.nn.ClipGradByGlobalNorm(...) to clip",
                               self.args.max_grad_norm)
            elif clip.groups:
                logger.info("gradient clip of the given optimizer: %s", clip.describe())
        check_gradient_clip(clip, whole_gradients=self.topology.world_size == 1 or not self.topology.use_hybrid)
        return clip

    # ----------------------------------------------------------------------------------- steps
    def autocast_smart_context_manager(self):
        """The forward context: AMP auto_cast when enabled."""
        return self.amp.autocast()

    def _prepare_inputs(self, inputs: Dict[str, Any]) -> Dict[str, Any]:
        return {k: (paddle.to_tensor(v) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}

    def compute_loss(self, model, inputs: Dict[str, Any], return_outputs: bool = False):
        """The loss of one micro-batch: the model's own loss, or ``criterion(logits, labels)`` (``loss.batch_loss``)."""
        loss, outputs = batch_loss(model, inputs, self.criterion, self.label_names)
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs: Dict[str, Any]) -> paddle.Tensor:
        """Forward + backward of one micro-batch; returns the detached loss × its weight / accumulation steps."""
        if not model.training:  # Layer.train() walks every sublayer: do it only after an evaluation
            model.train()
        inputs = self._sequence_segment(self._prepare_inputs(inputs))
        with self.autocast_smart_context_manager():
            loss = self.compute_loss(model, inputs)
        weight = self._loop.next_loss_weight() if self._loop is not None else None  # its share of the global batch
        loss = scale_micro_batch_loss(loss, weight, self.args.gradient_accumulation_steps)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def _micro_batched_forward_backward(self, micro_batches: List[Dict[str, Any]]) -> paddle.Tensor:
        """Σ over micro-batches of loss·weight/A = the step's loss (``optim.loss``: the global batch's mean).

        Gradients are synchronised only on the last micro-batch (``no_sync`` before it).
        """
        total = None
        last = len(micro_batches) - 1
        for i, inputs in enumerate(micro_batches):
            with (no_sync(self.model_wrapped) if i < last else contextlib.nullcontext()):
                loss = self.training_step(self.model_wrapped, inputs)
            total = loss if total is None else total + loss
            if i < last:
                self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
        return total

    def _pipeline_forward_backward(self, micro_batches: List[Dict[str, Any]]) -> paddle.Tensor:
        """1F1B over the step's micro-batches, under autocast; the mean loss is broadcast to every stage."""
        self.model_wrapped.train()
        batches = [self._sequence_segment(self._prepare_inputs(b)) for b in micro_batches]
        with self.autocast_smart_context_manager():
            return pipeline.train_batch(self.model_wrapped, batches, self.scaler, self._loop.loss_weights)

    def _optimizer_step(self) -> paddle.Tensor:
        """Synchronise the gradients, unscale them, clip by the global norm, then step or skip on every rank alike;
        returns the norm, unread. See ``overflow``: the verdict comes from the global norm, so every rank of every
        axis takes the same branch; only skip/rollback/fp16 read it here, and a skipped step holds the LR schedule.
        """
        optimizer = self.optimizer
        optimizer.sync_gradients()  # grads averaged over dp × sharding (reduced to their owners)
        gradients = optimizer.named_counted_gradients()  # (name, grad, whether this rank counts it in the norm)
        divisor = overflow.delayed_loss_divisor(self.model_wrapped)
        found_inf = overflow.unscale_gradients(self.scaler, [grad for _, grad, _ in gradients], divisor)
        grad_norm = clip_named_gradients(gradients, self.topology, self.gradient_clip, nonfinite=found_inf)
        action = self._loop.nonfinite.decide(grad_norm, self.state)  # may raise NonFiniteLossError
        self._checkpointer.wait_for_snapshot()  # an async save's host copy is taken before the step writes weights
        with self.timers("optimizer"):
            if action == overflow.STEP:
                optimizer.step()
            optimizer.clear_grad()
        overflow.update_loss_scale(self.scaler, found_inf=action == overflow.SKIP)
        if action == overflow.SKIP:
            self.state.skipped_steps += 1
            logger.warning("step %d: gradient norm is %s; update skipped (%d skipped so far)%s",
                           self.state.global_step + 1, float(grad_norm), self.state.skipped_steps,
                           "" if self.scaler is None else f", loss scale now {overflow.loss_scale(self.scaler)}")
        else:
            self.lr_scheduler.step()
        return grad_norm

    # ----------------------------------------------------------------------------------- train
    def train(self, resume_from_checkpoint: Optional[Union[str, bool]] = None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        """Run the training loop; returns ``TrainOutput(global_step, training_loss, metrics)``.

        One run per ``output_dir``: its lock is held until this returns or raises (``_output_dir_lock``); what
        ``output_dir`` holds is checked under it, so another run cannot change it between the check and the lock."""
        with self._output_dir_lock():
            checks.check_output_dir(self.args, resume_from_checkpoint)
            return self._train_holding_output_dir(resume_from_checkpoint, ignore_keys_for_eval)

    def _train_holding_output_dir(self, resume_from_checkpoint, ignore_keys_for_eval) -> TrainOutput:
        args = self.args
        self._startup.skip()  # the script between Trainer() and train() is "other"
        resume = self._resolve_resume(resume_from_checkpoint)
        self._keep_saved_global_batch(resume)  # before the sampler and the step count, which are counted in it
        self._check_wrapped_accumulation()
        train_dataloader = self.get_train_dataloader()
        self._startup.mark("first_batch")
        sampler = train_dataloader.batch_sampler if isinstance(train_dataloader.batch_sampler, GlobalBatchSampler) else None
        plan = self._plan_epochs(sampler)
        steps_per_epoch, max_steps, num_epochs = plan
        self._apply_minimum_eval_times(max_steps)
        self.create_optimizer_and_scheduler(num_training_steps=max_steps)
        self._startup.mark("optimizer")
        self._wrap_model_and_optimizer()
        self._startup.mark("wrap")
        if self._loop is not None:  # an earlier train() call, maybe left by an error: no stale gradients
            self.optimizer.clear_grad()
        self.state.max_steps = max_steps
        self.state.num_train_epochs = num_epochs
        if resume is not None:
            resume = self._load_resume_checkpoint(resume)  # auto: an older one if this one is corrupt
            self._startup.mark("model")
        checks.check_checkpoint_collisions(args.output_dir, self.state.global_step, max_steps, resume)
        cls = type(self)  # the method unbound (see LoopState.forward_backward)
        forward_backward = cls._pipeline_forward_backward if self._is_pipeline else cls._micro_batched_forward_backward
        self._loop = LoopState.start(args, self.topology, self.model_wrapped, self.scaler, self.state.global_step,
                                     forward_backward, self._flops_per_token())
        start_time = time.time()
        self._memory.start("train")
        self._stop.start(check_interval(args.logging_strategy, args.logging_steps))
        try:
            self._run_epochs(train_dataloader, sampler, plan, resume, ignore_keys_for_eval)
        except BaseException as err:
            self._stop.stop()  # nobody checks the flag now: a signal goes to the previous handler
            self._memory.stop("train")  # ends its sampler thread; the error propagates unchanged
            self._checkpointer.finish_after_error(
                same_on_every_rank=isinstance(err, (NonFiniteLossError, ReplicaDivergenceError)))
            raise
        try:
            return self._end_training(start_time)
        except BaseException:
            self._stop.stop()
            self._memory.stop("train")  # a no-op when the stage already ended
            raise

    def _run_epochs(self, train_dataloader, sampler, plan, resume, ignore_keys_for_eval) -> None:
        """``on_train_begin``, then the epochs from the data position; each ends with ``on_epoch_end`` and a
        log/save/evaluate check. The loop: PaddleNLP's event order (``trainer_callback`` module docstring)."""
        args, loop = self.args, self._loop
        steps_per_epoch, max_steps, num_epochs = plan
        self.callback_handler.train_dataloader = train_dataloader
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        consumed = self._data_start(resume, steps_per_epoch, loop.global_batch)
        for epoch in range(num_epochs):
            if steps_per_epoch is not None:
                samples_per_epoch = steps_per_epoch * loop.global_batch
                if consumed >= (epoch + 1) * samples_per_epoch:
                    continue  # epoch finished before the resume point
                sampler.set_epoch(epoch, consumed - epoch * samples_per_epoch if consumed > epoch * samples_per_epoch else 0)
            elif epoch == 0 and consumed:
                train_dataloader.dataset.skip_items = consumed  # stream: skip the items already trained on
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            if self._train_epoch(iter(train_dataloader), epoch, steps_per_epoch, ignore_keys_for_eval) == 0:
                # a finite stream ran out; every data rank reads the same stream: the same step
                logger.warning("the epoch yielded no batch: training stops at step %d of max_steps=%d (a finite "
                               "stream has fewer steps than max_steps)", self.state.global_step, max_steps)
                self.control.should_training_stop = True
            consumed = self.state.consumed_samples
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            self._maybe_log_save_evaluate(loop.meter, loop.flops_per_token, ignore_keys_for_eval)
            if self.control.should_training_stop or self.state.global_step >= max_steps:
                break
        loop.nonfinite.raise_if_seen(self.state)  # nan_inf_policy=error: the steps since the last log

    def _train_epoch(self, batches, epoch: int, steps_per_epoch: Optional[int], ignore_keys_for_eval) -> int:
        """The steps of one epoch read from ``batches`` (closed when the epoch is left, by an error too, so no
        reader thread stays blocked); returns the steps read."""
        loop, epoch_steps = self._loop, 0
        try:
            while True:
                micro_batches = self._read_step(batches, loop.accumulation)
                self._startup.mark("first_batch")
                if micro_batches is None:
                    return epoch_steps  # end of the epoch (the sampler yields whole steps)
                epoch_steps += 1
                step_loss = self._train_step(micro_batches)
                self._startup.mark("first_step")  # the startup report, once
                if step_loss is None or not self._end_step(micro_batches, step_loss, epoch, steps_per_epoch):
                    continue  # rolled back: the step is discarded
                self._maybe_log_save_evaluate(loop.meter, loop.flops_per_token, ignore_keys_for_eval)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    return epoch_steps
        finally:
            close_batches(batches)

    def _train_step(self, micro_batches: List[Dict[str, Any]]) -> Optional[paddle.Tensor]:
        """One optimizer step: forward/backward of the micro-batches, gradient sync, then unscale, clip, the
        non-finite verdict and the update (``_optimizer_step``). Returns the step's loss (Σ_m loss_m·w_m / GA, on the
        device; ``optim.loss``), or None when a non-finite gradient norm rolled the run back (``nan_inf_policy=rollback``)."""
        args, loop = self.args, self._loop
        if args.count_trained_tokens:
            loop.tokens.update(micro_batches)
        loop.loss_weights = self._micro_batch_loss_weights(micro_batches)  # before any sep/cp cut: whole counts
        with self.timers("forward_backward"):
            step_loss = loop.forward_backward(self, micro_batches)  # grads summed over the micro-batches
        self.control = self.callback_handler.on_optimizer_begin(args, self.state, self.control, scaler=self.scaler)
        try:  # sync; g /= loss scale; norm = sqrt(Σ g²) over tp×pp×sharding; g *= min(1, max_norm/norm); step
            loop.grad_norm = self._optimizer_step()  # no host read unless skip/rollback/fp16
        except NonFiniteLossError as err:  # the same verdict on every rank (global norm)
            if loop.rollback is None:
                raise
            loop.rollback.recover(self, err, data_position=self.state.consumed_samples + loop.global_batch,
                                  verified_step=loop.replicas.rollback_limit)
            loop.replicas.restart(self.state.global_step)  # the loaded state's step (recover replaced self.state)
            return None
        self.control = self.callback_handler.on_optimizer_end(args, self.state, self.control, scaler=self.scaler)
        return step_loss

    def _end_step(self, micro_batches, step_loss: paddle.Tensor, epoch: int, steps_per_epoch: Optional[int]) -> bool:
        """Count the applied step (loss, throughput, step, data position, epoch), agree on a stop, ``on_step_end``,
        then the replica check when due; False when that check rolled the run back (the step is discarded)."""
        args, loop = self.args, self._loop
        loop.losses.add(step_loss, replace_nonfinite=args.logging_nan_inf_filter)  # read at the next logging step
        loop.meter.update(micro_batches, per_rank_to_global=self.topology.data_world_size)
        self.state.global_step += 1
        loop.applied_steps += 1
        self.state.consumed_samples += loop.global_batch
        self.state.epoch = (
            self.state.consumed_samples / (steps_per_epoch * loop.global_batch) if steps_per_epoch else float(epoch)
        )
        if self._stop.agreed(self.topology, self.state.global_step):  # all-reduce every `every` steps
            self.control.should_save = True
            self.control.should_training_stop = True
        self.control = self.callback_handler.on_step_end(args, self.state, self.control)
        return self._check_replicas()

    def _check_replicas(self) -> bool:
        """Every replica_check_steps and before every save (so each checkpoint is of verified weights and a rollback
        can go back to it): one all_gather of the weights' fingerprints, one host read. False when a divergence
        rolled the run back (``nan_inf_policy=rollback``)."""
        loop = self._loop
        if not loop.replicas.due(self.state.global_step, saving=self.control.should_save):
            return True
        try:
            loop.replicas.check(self.state.global_step)
        except ReplicaDivergenceError as err:  # the same table, so the same verdict, on every replica
            if loop.rollback is None:
                raise
            loop.rollback.recover(self, err, data_position=self.state.consumed_samples, step_applied=True,
                                  cause="replica divergence", verified_step=loop.replicas.rollback_limit)
            loop.replicas.restart(self.state.global_step)
            self.control.should_log = self.control.should_evaluate = self.control.should_save = False
            return False
        return True

    def _end_training(self, start_time: float) -> TrainOutput:
        """After the loop: the loss not yet logged, the save in flight, the token count, the best model, and the
        run's metrics (``on_train_end``)."""
        args, loop = self.args, self._loop
        if loop.losses.steps:  # fold the loss not yet logged into the total
            loop.losses.reduce_and_reset(self.topology)
        self._finish_checkpoints()
        self.log_trained_tokens()
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        train_loss = loop.losses.total / max(loop.applied_steps, 1)
        metrics = speed_metrics("train", start_time, num_samples=self.state.consumed_samples, num_steps=self.state.global_step)
        metrics["train_loss"] = train_loss
        metrics.update(self._memory.stop("train"))
        metrics["progress_or_epoch"] = self.state.epoch
        self.log(dict(metrics))
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(self.state.global_step, train_loss, metrics)

    def _read_step(self, batches, ga: int) -> Optional[List[Dict[str, Any]]]:
        """Read the step's ``ga`` micro-batches (``on_load_data_end`` each; ``on_step_begin`` after the first).

        The whole step is read before computing because the pipeline schedule needs all micro-batches at
        once; reading first in every layout keeps one event order for all of them. None at the epoch's end.
        """
        micro_batches = []
        with self.timers("data"):
            for i in range(ga):
                try:
                    micro_batches.append(next(batches))
                except StopIteration:
                    return None
                self.control = self.callback_handler.on_load_data_end(self.args, self.state, self.control, inputs=micro_batches[-1])
                if i == 0:
                    self.control = self.callback_handler.on_step_begin(self.args, self.state, self.control)
        return micro_batches

    def _flops_per_token(self) -> Optional[float]:
        return flops_per_token_of_model(self.model)

    def _maybe_log_save_evaluate(self, meter: ThroughputMeter, flops_per_token, ignore_keys_for_eval):
        args, control = self.args, self.control
        loop = self._loop
        if control.should_log or control.should_evaluate or control.should_save:
            loop.nonfinite.raise_if_seen(self.state)  # before a non-finite model is logged, evaluated or saved
        if control.should_log and loop.losses.steps:
            steps = loop.losses.steps
            loss_sum = loop.losses.reduce_and_reset(self.topology)  # also added to the run's total
            logs: Dict[str, float] = {
                "loss": round(loss_sum / steps, 8),
                "learning_rate": float(self.optimizer.get_lr()),
                "global_step": self.state.global_step,
            }
            if loop.grad_norm is not None:
                logs["grad_norm"] = float(loop.grad_norm)
            logs.update(meter.report(flops_per_token=flops_per_token, peak_flops=args.peak_flops_per_device,
                                     num_devices=self.topology.world_size))
            logs["peak_memory_MB"] = round(peak_memory_bytes() / 2**20, 1)
            logs.update(overflow.scaler_logs(self.scaler, self.state.skipped_steps))
            logs.update(self.timers.report_and_reset())
            logs.update(getattr(self.model, "extra_metrics", dict)())  # the model's own numbers (MoE expert load)
            self.log(logs)
        metrics = None
        if control.should_evaluate and self.eval_dataset is not None:
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if control.should_save:
            with self.timers("checkpoint_save"):
                self._save_checkpoint(metrics)
            self.control = self.callback_handler.on_save(args, self.state, self.control)
            self.log_trained_tokens()

    # ----------------------------------------------------------------------------------- logging & state
    def log(self, logs: Dict[str, float]) -> None:
        """Record ``logs`` in the state's history and hand them to the callbacks (writers, progress bars)."""
        if self.state.epoch is not None:
            logs["epoch"] = round(self.state.epoch, 4)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs=logs)
