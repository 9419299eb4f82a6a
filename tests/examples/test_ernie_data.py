"""The ERNIE example's data: the ChnSentiCorp loader (TSV and JSON lines) and the bundled sample."""
import json
from collections import Counter, defaultdict

import pytest

from .helpers import ERNIE, load_module

chnsenticorp = load_module(ERNIE / "chnsenticorp.py", "chnsenticorp")
make_sample = load_module(ERNIE / "data" / "make_sample.py", "make_sample")


def test_reads_every_chnsenticorp_tsv_header_form(tmp_path):
    (tmp_path / "train.tsv").write_text("label\ttext_a\n1\t很好\n0\t很差\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("qid\tlabel\ttext_a\n0\t1\t不错\"引号\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("qid\ttext_a\n7\t一般\n", encoding="utf-8")
    assert chnsenticorp.load_split(tmp_path, "train") == [
        {"text": "很好", "label": 1, "qid": ""}, {"text": "很差", "label": 0, "qid": ""}]
    assert chnsenticorp.load_split(tmp_path, "dev") == [{"text": "不错\"引号", "label": 1, "qid": "0"}]
    assert chnsenticorp.load_split(tmp_path, "test") == [{"text": "一般", "label": None, "qid": "7"}]


def test_reads_json_lines_with_text_or_text_a(tmp_path):
    rows = [{"text": "很好", "label": 1}, {"text_a": "很差", "label": "0", "qid": 3}, {"text": "没标签"}]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n",
                                         encoding="utf-8")
    assert chnsenticorp.load_split(tmp_path, "train") == [
        {"text": "很好", "label": 1, "qid": ""}, {"text": "很差", "label": 0, "qid": "3"},
        {"text": "没标签", "label": None, "qid": ""}]


def test_missing_split_and_missing_text_column_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="dev"):
        chnsenticorp.load_split(tmp_path, "dev")
    (tmp_path / "train.tsv").write_text("label\tsentence\n1\t好\n", encoding="utf-8")
    with pytest.raises(ValueError, match="text_a"):
        chnsenticorp.load_split(tmp_path, "train")


def test_bundled_sample_is_reproducible_from_its_generator(tmp_path):
    make_sample.main(tmp_path, tmp_path / "vocab.txt")
    for name in ("train.tsv", "dev.tsv", "test.tsv", "test_labels.tsv"):
        assert (tmp_path / name).read_bytes() == (ERNIE / "data" / name).read_bytes(), name
    assert (tmp_path / "vocab.txt").read_bytes() == (ERNIE / "tiny_ernie" / "vocab.txt").read_bytes()


def test_bundled_sample_is_balanced_disjoint_and_fully_labeled():
    splits = {s: chnsenticorp.load_split(ERNIE / "data", s) for s in ("train", "dev", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 600, "dev": 150, "test": 150}
    for examples in splits.values():
        counts = Counter(e["label"] for e in examples)
        assert counts[0] == counts[1] == len(examples) // 2  # test labels come from test_labels.tsv
    texts = [{e["text"] for e in v} for v in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])


def test_no_single_character_position_separates_the_labels():
    """The signal is the sentiment words, wherever they are: a (position -> char -> label) lookup fit on
    train must stay far below what the tiny model reaches on dev (~0.99)."""
    train = chnsenticorp.load_split(ERNIE / "data", "train")
    dev = chnsenticorp.load_split(ERNIE / "data", "dev")
    best = 0.0
    for pos in range(40):
        votes = defaultdict(Counter)
        for e in train:
            votes[e["text"][pos: pos + 1]][e["label"]] += 1
        rule = {c: v.most_common(1)[0][0] for c, v in votes.items()}
        best = max(best, sum(rule.get(e["text"][pos: pos + 1], 1) == e["label"] for e in dev) / len(dev))
    assert best < 0.75
