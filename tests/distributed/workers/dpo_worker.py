"""DPO on one layout: a tiny PaddleNLP Llama (tp ranks from the layout, vocabulary-parallel logits under tp; its
``...Pipe`` form under pp, the DPO config on its model config as PaddleNLP's run_dpo.py sets it) and its frozen
reference (or none: ``--reference_free``; or, ``--lora_policy``, the policy with LoRA adapters, its own reference
with them off), preference pairs packed several to a row (PaddleNLP's zero-padding stream, so rows hold 1 or 2
pairs), 4 steps of a global batch of 8 rows, then ``evaluate()`` and ``predict()`` of the eval set.
Writes rank<r>.json: every step's logged loss and DPO metrics, the eval metrics and the predict loss."""
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from common import exit_cleanly, parse_worker_arguments, write_json

MAX_LEN, VOCAB = 48, 96


@dataclass
class DPOWorkerArguments:
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    weights: str = field(default=None, metadata={"help": "the tiny Llama's from_pretrained directory"})
    reference_free: bool = field(default=False, metadata={"help": "no reference model (DPOConfig.reference_free)"})
    lora_policy: bool = field(default=False, metadata={"help": "a LoRA policy, its own reference (DPOConfig.lora)"})


class CharTokenizer:
    """One id per character (3..95), eos 1: the interface ``preprocess_preference_data`` uses."""

    chat_template, eos_token_id, pad_token_id = None, 1, 0

    def encode(self, text, add_special_tokens=True):
        return {"input_ids": [3 + ord(c) % (VOCAB - 3) for c in text]}


class Lengths:
    max_seq_len, max_prompt_len, flash_mask = MAX_LEN, 24, False


def preference_rows(n, seed):
    from paddlenlp.datasets import MapDataset, ZeroPaddingMapDataset

    from paddletrainer.trl import preprocess_preference_data

    rng = np.random.RandomState(seed)
    words = lambda k: "".join(chr(97 + c) for c in rng.randint(0, 26, size=k))  # noqa: E731
    rows = [preprocess_preference_data({"src": words(rng.randint(3, 16)), "tgt": [],
                                        "response": [words(rng.randint(2, 12)), words(rng.randint(2, 12))],
                                        "sort": [int(s) for s in rng.permutation(2)]},
                                       CharTokenizer(), Lengths(), Lengths()) for _ in range(n)]
    return ZeroPaddingMapDataset(MapDataset(rows), tokenizer=CharTokenizer(), max_length=MAX_LEN)


def build_llama(weights, topology, dpo_config):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    config = LlamaConfig.from_pretrained(weights)
    config.dpo_config = dpo_config
    config.tensor_parallel_degree, config.tensor_parallel_rank = topology.tp_degree, topology.tp_rank
    config.tensor_parallel_output = True
    config.sep_parallel_degree = topology.sep_degree
    config.max_position_embeddings = config.seq_length = MAX_LEN  # rows are longer than pretraining's; rope has no weights
    cls = LlamaForCausalLMPipe if topology.pp_degree > 1 else LlamaForCausalLM
    return cls.from_pretrained(weights, config=config, dtype="float32")


def lora_policy(model):
    """``model`` with ``paddlenlp.peft`` LoRA adapters on q/v (its base frozen by ``LoRAModel``), returned as the
    model inside the ``LoRAModel``, as PaddleNLP's Trainer hands a LoRA model to the pipeline (the Trainer refuses a
    ``LoRAModel`` over a pipeline model for its checkpoints' sake; none is written here). Every adapter matrix,
    B included, is filled from a seed of its plain-model name, so a pipeline stage holds the one process's values
    and the policy differs from its LoRA-off reference from the first step."""
    from paddlenlp.peft import LoRAConfig, LoRAModel

    inner = LoRAModel(model, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8)).model
    adapters = {name: t for name, t in inner.state_dict().items() if ".lora_" in name}
    plain_name = r"llama\.layers\.\d+\.self_attn\.[qv]_proj\.lora_[AB]"
    assert adapters and all(re.fullmatch(plain_name, n) for n in adapters), sorted(adapters)
    for name, tensor in adapters.items():
        rng = np.random.RandomState(zlib.crc32(name.encode()))
        tensor.set_value((0.05 * rng.randn(*tensor.shape)).astype("float32"))
    return inner


def main():
    worker_args, args = parse_worker_arguments(DPOWorkerArguments)
    from paddletrainer.parallel import init_topology
    from paddletrainer.trl import DPOConfig, DPOTrainer, preference_collate_fn

    topology = init_topology(args.parallel_config)
    dpo_config = DPOConfig(beta=0.5, reference_free=worker_args.reference_free, lora=worker_args.lora_policy)
    policy = build_llama(worker_args.weights, topology, dpo_config)
    if worker_args.lora_policy:
        policy = lora_policy(policy)
    own_reference = worker_args.reference_free or worker_args.lora_policy
    reference = None if own_reference else build_llama(worker_args.weights, topology, dpo_config)
    trainer = DPOTrainer(model=policy, ref_model=reference,
                         dpo_config=dpo_config,
                         args=args, train_dataset=preference_rows(70, 0), eval_dataset=preference_rows(20, 1),
                         data_collator=lambda batch: preference_collate_fn(batch, MAX_LEN), ignore_eos_token=True)
    trainer.train()
    steps = [{k: v for k, v in h.items() if k == "loss" or "/" in k or k.endswith("_loss")}
             for h in trainer.state.log_history if "loss" in h]
    evaluation = {k: v for k, v in trainer.evaluate().items() if "/" in k or k.endswith("loss")}
    predicted = trainer.predict(preference_rows(20, 1)).metrics["test_loss"]
    write_json(os.path.join(worker_args.result_dir, f"rank{args.process_index}.json"),
               {"rank": args.process_index, "steps": steps, "eval": evaluation, "test_loss": predicted})
    exit_cleanly(topology)


if __name__ == "__main__":
    main()
