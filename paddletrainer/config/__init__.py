"""The arguments layer: what turns PaddleNLP's options into the typed configs each subsystem owns.

* :mod:`.builders` — the arguments → ``ParallelConfig``, ``AmpSettings``, ``RollbackConfig``, ``MetricsConfig``,
  ``ReplicaCheckConfig`` (paddle-free);
* :mod:`.paddlenlp_options` — PaddleNLP's and PaddleFormers' options that are refused, accepted with no effect
  or translated;
* :mod:`.arg_checks` — value checks over every field (finite floats, int ranges, batch and worker bounds);
* :mod:`.hf_options` — Hugging Face's options PaddleNLP lacks;
* :mod:`.arguments_base` — ``TrainingArguments``' field-less base: this process's ranks and serialization;
* :mod:`.derived_values` — its other field-less base: the typed configs and the values derived from the options
  (``parallel_config`` and its views, batch sizes, warmup and decay steps), as read-only attributes.

``paddletrainer.training_args`` (PaddleNLP's path) holds the fields. Nothing here imports paddle.
"""
