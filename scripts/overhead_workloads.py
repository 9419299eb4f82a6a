"""The three training loops ``bench_overhead.py`` compares, on its two workloads.

* :class:`BareLoop` / :func:`run_bare`: the tightest loop a user would write (``paddle.io.DataLoader``,
  forward, backward, ``paddle.optimizer.AdamW`` with ``ClipGradByGlobalNorm``, LR schedule, one host read
  per logging step);
* :func:`run_paddletrainer` and :func:`run_paddlenlp`: each Trainer with its defaults and the same settings
  (:func:`_common_args`).

Each ``run_*`` returns the per-step end timestamps; the trainers call ``on_step_end()`` after each stamp
(the benchmark runs a bare-loop step there). The workloads are a tiny ERNIE sequence classifier and a tiny
Llama causal LM with random ids (``workloads``; ``tiny=True`` shrinks them for the smoke test).
"""
from __future__ import annotations

import tempfile
import time

import numpy as np

RUNNERS = ("bare", "paddletrainer", "paddlenlp")
LR = 5e-5
CLIP = 1.0
SEED = 1234


# ------------------------------------------------------------------------------------ workloads
def workloads(tiny: bool) -> dict:
    """name -> shapes. Full mode is sized so one step is a few tens of ms on one CPU core (the whole script
    must stay under 10 minutes on a shared 2-core machine)."""
    if tiny:
        return {
            "ernie-cls": dict(kind="ernie", hidden=64, layers=2, heads=2, inter=128, vocab=305, seq=32, batch=8),
            "llama-clm": dict(kind="llama", hidden=64, layers=2, heads=4, inter=128, vocab=640, seq=32, batch=4),
        }
    return {
        "ernie-cls": dict(kind="ernie", hidden=128, layers=2, heads=4, inter=512, vocab=3000, seq=64, batch=8),
        "llama-clm": dict(kind="llama", hidden=128, layers=2, heads=4, inter=344, vocab=3200, seq=64, batch=4),
    }


def build_model(spec: dict):
    import paddle

    paddle.seed(SEED)
    if spec["kind"] == "ernie":
        from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

        cfg = ErnieConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                          num_attention_heads=spec["heads"], intermediate_size=spec["inter"],
                          max_position_embeddings=max(128, spec["seq"]), num_labels=2)
        return ErnieForSequenceClassification(cfg)
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                      num_attention_heads=spec["heads"], num_key_value_heads=spec["heads"],
                      intermediate_size=spec["inter"], max_position_embeddings=max(128, spec["seq"]),
                      use_flash_attention=False, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def build_dataset(spec: dict, n: int) -> list:
    rng = np.random.RandomState(0)
    ids = rng.randint(3, spec["vocab"], size=(n, spec["seq"] + 1)).astype("int64")
    if spec["kind"] == "ernie":
        labels = rng.randint(0, 2, size=(n,)).astype("int64")
        return [{"input_ids": ids[i, :-1], "labels": labels[i]} for i in range(n)]
    return [{"input_ids": ids[i, :-1], "labels": ids[i, 1:]} for i in range(n)]


def loss_of(outputs):
    """The loss in a model's outputs (a dict's ``"loss"``, or the first item)."""
    if isinstance(outputs, dict):
        return outputs["loss"]
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


# ------------------------------------------------------------------------------------ runners
class BareLoop:
    """The tight loop a user would write, one optimizer step per :meth:`step` (next epoch when one ends)."""

    def __init__(self, spec, dataset, steps, logging_steps, world_size=1):
        import paddle

        model = build_model(spec)
        self.model = paddle.DataParallel(model) if world_size > 1 else model
        self.sched = paddle.optimizer.lr.LambdaDecay(LR, lambda s: max(0.0, 1.0 - s / steps))
        self.opt = paddle.optimizer.AdamW(learning_rate=self.sched, parameters=self.model.parameters(),
                                          weight_decay=0.0, grad_clip=paddle.nn.ClipGradByGlobalNorm(CLIP))
        if world_size > 1:
            sampler = paddle.io.DistributedBatchSampler(dataset, batch_size=spec["batch"], shuffle=True,
                                                        drop_last=True)
            self.loader = paddle.io.DataLoader(dataset, batch_sampler=sampler, return_list=True)
        else:
            self.loader = paddle.io.DataLoader(dataset, batch_size=spec["batch"], shuffle=True, drop_last=True,
                                               return_list=True)
        self.model.train()
        self.world_size, self.logging_steps = world_size, logging_steps
        self.steps, self.tr_loss, self.batches = 0, paddle.zeros([], "float32"), iter(self.loader)

    def step(self) -> None:
        import paddle

        try:
            batch = next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        loss = loss_of(self.model(**batch))
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        self.sched.step()
        self.tr_loss += loss.detach()
        self.steps += 1
        if self.steps % self.logging_steps == 0:
            if self.world_size > 1:
                paddle.distributed.all_reduce(self.tr_loss)
            float(self.tr_loss)  # the log's one host read
            self.tr_loss = paddle.zeros([], "float32")


def run_bare(spec, dataset, steps, logging_steps, world_size=1):
    """The tight loop; returns the per-step end timestamps."""
    loop = BareLoop(spec, dataset, steps, logging_steps, world_size)
    stamps = []
    for _ in range(steps):
        loop.step()
        stamps.append(time.perf_counter())
    return stamps


def _common_args(out_dir, spec, steps, logging_steps):
    # ddp_find_unused_parameters=False: the bare loop's DataParallel default. Unset, both trainers resolve it
    # as PaddleNLP does (True unless a layer recomputes), and the reducer then walks the backward graph every
    # step: ~2% of the Llama dp2 step here (see docs/benchmarks.md), the same cost in both trainers.
    return dict(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=spec["batch"],
                learning_rate=LR, weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear",
                max_grad_norm=CLIP, logging_steps=logging_steps, save_strategy="no", disable_tqdm=True,
                report_to="none", seed=SEED, dataloader_num_workers=0, ddp_find_unused_parameters=False)


def _run_trainer(package, spec, dataset, steps, logging_steps, on_step_end, **extra_args):
    """``package.Trainer`` (paddletrainer or paddlenlp.trainer) with :func:`_common_args`; the per-step end
    timestamps (``on_step_end()`` runs after each stamp)."""
    stamps = []

    class Stamp(package.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())
            if on_step_end is not None:
                on_step_end()

    with tempfile.TemporaryDirectory() as out:
        args = package.TrainingArguments(**_common_args(out, spec, steps, logging_steps), evaluation_strategy="no",
                                         **extra_args)
        trainer = package.Trainer(model=build_model(spec), args=args, train_dataset=dataset, callbacks=[Stamp()])
        trainer.train()
    return stamps


def run_paddletrainer(spec, dataset, steps, logging_steps, world_size=1, on_step_end=None):
    """paddletrainer's Trainer with its defaults; returns the per-step end timestamps."""
    import paddletrainer

    return _run_trainer(paddletrainer, spec, dataset, steps, logging_steps, on_step_end)


def run_paddlenlp(spec, dataset, steps, logging_steps, world_size=1, on_step_end=None):
    """PaddleNLP's Trainer with its defaults (its profiling timers off); returns the per-step end timestamps."""
    import paddlenlp.trainer

    return _run_trainer(paddlenlp.trainer, spec, dataset, steps, logging_steps, on_step_end, skip_profile_timer=True)


RUN = {"bare": run_bare, "paddletrainer": run_paddletrainer, "paddlenlp": run_paddlenlp}
