"""Tokenize a plain-text corpus into the token files read by ``paddletrainer.datasets.PretrainTokenDataset``.

Input: UTF-8 text. ``--doc_sep blank`` (default): documents are paragraphs separated by one or more blank
lines (line breaks inside a paragraph are kept). ``--doc_sep line``: every non-empty line is a document.

Output, for ``--output <prefix>``:
    <prefix>.ids.npy   1-D array of token ids, all documents concatenated, each followed by EOS.
                       dtype uint16 when vocab_size <= 65536, else int32. Standard .npy, so
                       ``np.load(path, mmap_mode="r")`` maps it without reading it into memory.
    <prefix>.idx.npy   int64 offsets, length num_docs + 1: document d is ids[idx[d]:idx[d+1]]
                       (its EOS included); idx[0] == 0 and idx[-1] == len(ids).
    <prefix>.meta.json {"format", "dtype", "vocab_size", "eos_token_id", "bos_token_id", "num_docs",
                        "num_tokens", "add_bos", "tokenizer", "source"}

Example:
    python scripts/build_pretrain_data.py --input llm_examples/llama/data/corpus.txt \
        --tokenizer llm_examples/llama/tiny_llama --output data/tiny/corpus
"""
import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT = "paddletrainer-pretrain-v1"


def iter_documents(path, doc_sep="blank"):
    """Yield documents (str) from a text file; see the module docstring for the two layouts."""
    with open(path, encoding="utf-8") as f:
        if doc_sep == "line":
            for line in f:
                if line.strip():
                    yield line.strip()
            return
        buf = []
        for line in f:
            if line.strip():
                buf.append(line.rstrip("\n"))
            elif buf:
                yield "\n".join(buf)
                buf = []
        if buf:
            yield "\n".join(buf)


def token_dtype(vocab_size):
    """Smallest dtype that holds every id: uint16 halves the file for vocabularies up to 65536."""
    return np.uint16 if vocab_size <= 65536 else np.int32


def build(input_path, tokenizer, output_prefix, doc_sep="blank", add_bos=False, batch_docs=256):
    """Tokenize ``input_path`` and write the three files; returns the meta dict.

    Ids are streamed to a temporary raw file first so memory stays bounded by one batch of documents;
    only at the end, when the total length is known, are they copied into the .npy.
    """
    vocab_size = len(tokenizer)
    dtype = token_dtype(vocab_size)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ValueError("the tokenizer has neither an eos nor a sep token to separate documents")
    bos = tokenizer.bos_token_id
    if add_bos and bos is None:
        raise ValueError("--add_bos given but the tokenizer has no bos token")
    prefix = Path(output_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    offsets = [0]
    fd, tmp_path = tempfile.mkstemp(dir=prefix.parent, suffix=".ids.tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            batch = []

            def flush():
                if not batch:
                    return
                encoded = tokenizer(batch, add_special_tokens=False, return_attention_mask=False)["input_ids"]
                for ids in encoded:
                    ids = ([bos] if add_bos else []) + list(ids) + [eos]
                    raw.write(np.asarray(ids, dtype=dtype).tobytes())
                    offsets.append(offsets[-1] + len(ids))
                batch.clear()

            for doc in iter_documents(input_path, doc_sep):
                batch.append(doc)
                if len(batch) >= batch_docs:
                    flush()
            flush()
        total = offsets[-1]
        out = np.lib.format.open_memmap(f"{prefix}.ids.npy", mode="w+", dtype=dtype, shape=(total,))
        if total:
            out[:] = np.memmap(tmp_path, dtype=dtype, mode="r", shape=(total,))
        out.flush()
        del out
    finally:
        os.unlink(tmp_path)
    np.save(f"{prefix}.idx.npy", np.asarray(offsets, dtype=np.int64))
    meta = {
        "format": FORMAT, "dtype": np.dtype(dtype).name, "vocab_size": vocab_size, "eos_token_id": eos,
        "bos_token_id": bos, "num_docs": len(offsets) - 1, "num_tokens": total, "add_bos": add_bos,
        "tokenizer": str(getattr(tokenizer, "name_or_path", "") or ""), "source": str(input_path),
    }
    Path(f"{prefix}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="UTF-8 text corpus")
    parser.add_argument("--tokenizer", required=True, help="local tokenizer directory (paddlenlp AutoTokenizer)")
    parser.add_argument("--output", required=True, help="output prefix, e.g. data/tiny/corpus")
    parser.add_argument("--doc_sep", choices=["blank", "line"], default="blank")
    parser.add_argument("--add_bos", action="store_true", help="also put BOS before every document")
    args = parser.parse_args(argv)
    from paddlenlp.transformers import AutoTokenizer  # imported late: --help stays fast

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    meta = build(args.input, tokenizer, args.output, args.doc_sep, args.add_bos)
    print(f"{meta['num_docs']} documents, {meta['num_tokens']} tokens ({meta['dtype']}) -> {args.output}.ids.npy")


if __name__ == "__main__":
    main()
