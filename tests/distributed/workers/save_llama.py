"""Build the tiny Llama once with a fixed seed and save it (every worker loads these weights)."""
import sys

import paddle

from common import tiny_llama_config


def main(out_dir):
    from paddlenlp.transformers import LlamaForCausalLM

    paddle.seed(2024)
    model = LlamaForCausalLM(tiny_llama_config())
    model.save_pretrained(out_dir)


if __name__ == "__main__":
    main(sys.argv[1])
