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
from pathlib import Path

import sentencepiece as spm

HERE = Path(__file__).parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(HERE / "corpus.txt"))
    parser.add_argument("--output_dir", default=str(HERE.parent / "tiny_llama"))
    parser.add_argument("--vocab_size", type=int, default=640)  # 256 byte pieces + ~380 merges/chars
    args = parser.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=args.input,
        model_prefix=str(out / "sentencepiece.bpe"),
        model_type="bpe",
        vocab_size=args.vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",  # like Llama; also keeps the file small (no NFKC table)
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,  # single thread keeps the merges reproducible
        minloglevel=2,
    )
    (out / "sentencepiece.bpe.vocab").unlink(missing_ok=True)  # human-readable dump, not needed to load
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": 128,
    }, indent=2) + "\n")
    config_path = out / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config["vocab_size"] = args.vocab_size
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {out / 'sentencepiece.bpe.model'} (vocab {args.vocab_size})")


if __name__ == "__main__":
    main()
