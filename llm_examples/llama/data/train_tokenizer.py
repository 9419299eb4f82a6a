"""Train the tiny SentencePiece BPE tokenizer in ``../tiny_llama/`` from ``corpus.txt`` (offline, seconds).

Llama conventions: ids 0/1/2 = <unk>/<s>/</s>, no pad id, ``byte_fallback`` so any UTF-8 text still
encodes without <unk> (unknown characters become byte pieces). The file is written under the name
paddlenlp's ``LlamaTokenizer`` looks for (``sentencepiece.bpe.model``), next to a ``tokenizer_config.json``,
so ``LlamaTokenizer.from_pretrained("llm_examples/llama/tiny_llama")`` works without network.
Afterwards set ``vocab_size`` in ``../tiny_llama/config.json`` to the printed size (the script does it).

Run:  python llm_examples/llama/data/train_tokenizer.py [--vocab_size 640]
"""
import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2] / "scripts"))  # one SentencePiece recipe, shared with the token builder
from build_pretrain_data import train_sentencepiece  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(HERE / "corpus.txt"))
    parser.add_argument("--output_dir", default=str(HERE.parent / "tiny_llama"))
    parser.add_argument("--vocab_size", type=int, default=640)  # 256 byte pieces + ~380 merges/chars
    args = parser.parse_args()
    out = train_sentencepiece(args.input, args.output_dir, args.vocab_size, model_max_length=128)
    config_path = out / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config["vocab_size"] = args.vocab_size
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {out / 'sentencepiece.bpe.model'} (vocab {args.vocab_size})")


if __name__ == "__main__":
    main()
