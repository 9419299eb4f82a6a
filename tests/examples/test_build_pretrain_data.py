"""paddletrainer-build-pretrain-data (``paddletrainer.tools.build_pretrain_data``, also ``scripts/build_pretrain_data.py``
in a checkout): documents in, the documented .ids/.idx/.meta files out."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .helpers import LLAMA, REPO

from paddletrainer.tools import build_pretrain_data as build_data  # noqa: E402


class CharTokenizer:
    """Stand-in tokenizer with the interface the tool uses: id = code point + 3 (0/1/2 = unk/bos/eos)."""

    eos_token_id, bos_token_id, sep_token_id = 2, 1, None

    def __init__(self, vocab_size=70000):
        self.vocab_size = vocab_size

    def __len__(self):
        return self.vocab_size

    def __call__(self, texts, add_special_tokens=False, return_attention_mask=False):
        return {"input_ids": [[ord(c) + 3 for c in t] for t in texts]}


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_blank_line_documents_keep_their_inner_line_breaks(tmp_path):
    src = write(tmp_path / "c.txt", "a b\nc\n\n\n\nd\n\ne f\n")
    assert list(build_data.iter_documents(src)) == ["a b\nc", "d", "e f"]


def test_line_mode_makes_every_nonempty_line_a_document(tmp_path):
    src = write(tmp_path / "c.txt", "a b\nc\n\nd\n")
    assert list(build_data.iter_documents(src, "line")) == ["a b", "c", "d"]


def test_round_trip_ids_offsets_and_meta(tmp_path):
    docs = ["hello", "a\nb", "xyz" * 100]
    src = write(tmp_path / "c.txt", "\n\n".join(docs) + "\n")
    meta = build_data.build(src, CharTokenizer(vocab_size=1000), tmp_path / "out" / "corpus", batch_docs=2)
    ids = np.load(tmp_path / "out" / "corpus.ids.npy", mmap_mode="r")
    idx = np.load(tmp_path / "out" / "corpus.idx.npy")
    assert ids.dtype == np.uint16 and idx.dtype == np.int64
    assert idx.tolist() == [0, 6, 10, 311]  # each document + its EOS
    for d, doc in enumerate(docs):
        piece = ids[idx[d]: idx[d + 1]]
        assert piece[-1] == CharTokenizer.eos_token_id
        assert "".join(chr(i - 3) for i in piece[:-1]) == doc
    assert meta == json.loads((tmp_path / "out" / "corpus.meta.json").read_text())
    assert (meta["num_docs"], meta["num_tokens"], meta["dtype"]) == (3, 311, "uint16")


def test_large_vocab_is_stored_as_int32_without_truncating_ids(tmp_path):
    src = write(tmp_path / "c.txt", "\U0001F600 ok\n")  # code point 128512 > 65535
    build_data.build(src, CharTokenizer(vocab_size=200000), tmp_path / "big")
    ids = np.load(tmp_path / "big.ids.npy")
    assert ids.dtype == np.int32 and ids[0] == 0x1F600 + 3


def test_add_bos_prefixes_every_document(tmp_path):
    src = write(tmp_path / "c.txt", "ab\n\ncd\n")
    build_data.build(src, CharTokenizer(1000), tmp_path / "b", add_bos=True)
    ids, idx = np.load(tmp_path / "b.ids.npy"), np.load(tmp_path / "b.idx.npy")
    assert [ids[o] for o in idx[:-1]] == [1, 1] and len(ids) == 8


def test_cli_with_the_bundled_tokenizer_decodes_back_to_the_corpus(tmp_path, no_network):
    from paddlenlp.transformers import AutoTokenizer

    docs = ["Anna found a red ball near the gate.\nBen smiled.", "Zoe said, \"I like your kite.\""]
    src = write(tmp_path / "c.txt", "\n\n".join(docs) + "\n")
    build_data.main(["--input", str(src), "--tokenizer", str(LLAMA / "tiny_llama"), "--output", str(tmp_path / "t")])
    tok = AutoTokenizer.from_pretrained(str(LLAMA / "tiny_llama"))
    ids, idx = np.load(tmp_path / "t.ids.npy"), np.load(tmp_path / "t.idx.npy")
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert meta["vocab_size"] == len(tok) and meta["eos_token_id"] == tok.eos_token_id
    assert ids.dtype == np.uint16
    decoded = [tok.decode(ids[idx[d]: idx[d + 1] - 1].tolist()) for d in range(len(docs))]
    assert decoded == docs


def test_tokenizer_without_eos_or_sep_is_refused(tmp_path):
    class NoEos(CharTokenizer):
        eos_token_id = None

    with pytest.raises(ValueError, match="eos"):
        build_data.build(write(tmp_path / "c.txt", "x\n"), NoEos(100), tmp_path / "n")


def test_committed_llama_token_files_match_a_fresh_build(tmp_path, no_network):
    """llm_examples/llama/data/tokens/ ships prebuilt so run_pretrain.py works at once; it must not go stale."""
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(LLAMA / "tiny_llama"))
    build_data.build(LLAMA / "data" / "corpus.txt", tok, tmp_path / "corpus")
    shipped = LLAMA / "data" / "tokens" / "corpus"
    for suffix in (".ids.npy", ".idx.npy"):
        assert np.array_equal(np.load(f"{shipped}{suffix}"), np.load(f"{tmp_path / 'corpus'}{suffix}")), suffix
    fresh, committed = (json.loads(Path(f"{p}.meta.json").read_text()) for p in (tmp_path / "corpus", shipped))
    ignore = ("tokenizer", "source")  # paths, relative or absolute depending on the build command
    assert {k: v for k, v in fresh.items() if k not in ignore} == {k: v for k, v in committed.items() if k not in ignore}


@pytest.mark.parametrize("flags, message", [
    (["--input", "missing.txt", "--tokenizer", ".", "--output", "o"], "--input missing.txt: no such file"),
    (["--input", "c.txt", "--tokenizer", "nowhere", "--output", "o"], "--tokenizer nowhere: no such directory"),
])
def test_the_tool_refuses_a_missing_input_or_tokenizer_with_a_usage_error(tmp_path, flags, message):
    write(tmp_path / "c.txt", "ab\n")
    proc = subprocess.run([sys.executable, "-m", "paddletrainer.tools.build_pretrain_data", *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"paddletrainer-build-pretrain-data: error: {message}")
