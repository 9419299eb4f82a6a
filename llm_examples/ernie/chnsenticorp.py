"""Read ChnSentiCorp-style sentiment files (TSV with a header, or JSON lines) into lists of dicts.

Each example is ``{"text": str, "label": int or None, "qid": str}``.

TSV: tab separated, first line a header naming the columns; the text column is ``text_a`` (or ``text``),
the label column ``label``, the id column ``qid``. That covers every split of PaddleNLP's ChnSentiCorp
download (train ``label text_a``, dev ``qid label text_a``, test ``qid text_a``).
JSON lines: one object per line with ``text`` (or ``text_a``), optional ``label`` and ``qid``.

A split is found in ``data_dir`` as the first existing ``{split}.tsv``, ``{split}.json``, ``{split}.jsonl``.
When ``data_dir/test_labels.tsv`` (``qid label``) exists its labels are attached to unlabeled test rows,
so the bundled sample can report test accuracy while ``test.tsv`` keeps the real, unlabeled format.
No paddle import here: the loader is cheap to test.
"""
import csv
import json
import os

SPLIT_EXTENSIONS = (".tsv", ".json", ".jsonl")


def _example(row, where):
    text = row.get("text_a", row.get("text"))
    if text is None:
        raise ValueError(f"{where}: no 'text_a' or 'text' field in {sorted(row)}")
    label = row.get("label")
    label = None if label in (None, "") else int(label)
    return {"text": str(text), "label": label, "qid": str(row.get("qid", ""))}


def read_examples(path):
    """All examples of one file; the format follows the extension (.json/.jsonl = JSON lines, else TSV)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        if path.endswith((".json", ".jsonl")):
            for n, line in enumerate(f, 1):
                if line.strip():
                    examples.append(_example(json.loads(line), f"{path}:{n}"))
        else:
            # QUOTE_NONE: review text may contain quote characters that are not CSV quoting.
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            for n, row in enumerate(reader, 2):
                examples.append(_example(row, f"{path}:{n}"))
    return examples


def find_split(data_dir, split):
    """Path of ``split`` in ``data_dir`` or None."""
    for ext in SPLIT_EXTENSIONS:
        path = os.path.join(data_dir, split + ext)
        if os.path.exists(path):
            return path
    return None


def load_split(data_dir, split):
    """Examples of ``train``/``dev``/``test`` (test labels merged from test_labels.tsv when present)."""
    path = find_split(data_dir, split)
    if path is None:
        raise FileNotFoundError(f"no {split}{{{','.join(SPLIT_EXTENSIONS)}}} in {data_dir}")
    examples = read_examples(path)
    labels_path = os.path.join(data_dir, "test_labels.tsv")
    if split == "test" and os.path.exists(labels_path):
        with open(labels_path, encoding="utf-8") as f:
            answers = {row["qid"]: int(row["label"]) for row in csv.DictReader(f, delimiter="\t")}
        for ex in examples:
            if ex["label"] is None and ex["qid"] in answers:
                ex["label"] = answers[ex["qid"]]
    return examples
