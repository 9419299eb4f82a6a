"""Memory-mapped causal-LM pretraining dataset over the token files of ``paddletrainer-build-pretrain-data``
(:mod:`paddletrainer.tools.build_pretrain_data`).

Packing: the documents (each already ending in EOS) form one token stream of length T. Sample i is the
window ``ids[i*L : i*L + L + 1]`` with L = ``max_seq_length``; ``input_ids`` is its first L tokens and
``labels`` its last L (the next-token targets), so consecutive samples share one boundary token and
``len = (T - 1) // L``. Windows cross document boundaries on purpose (no padding, every token is
trained); the EOS between documents tells the model where one ends. The tail shorter than a window is
dropped. Shuffling is the sampler's job (``paddletrainer.data.GlobalBatchSampler``), not the dataset's.
"""
import glob
import json
import os

import numpy as np


def resolve_prefix(path):
    """Accept a file prefix (``.../corpus``) or a directory holding exactly one ``*.ids.npy``."""
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.ids.npy")))
        if len(found) != 1:
            raise FileNotFoundError(
                f"{path} must contain exactly one *.ids.npy (found {len(found)}); build one with "
                f"paddletrainer-build-pretrain-data or pass the file prefix instead")
        return found[0][: -len(".ids.npy")]
    if path.endswith(".ids.npy"):
        path = path[: -len(".ids.npy")]
    if not os.path.exists(path + ".ids.npy"):
        raise FileNotFoundError(f"no token file {path}.ids.npy; build it with paddletrainer-build-pretrain-data")
    return path


class PretrainTokenDataset:
    """Map-style dataset of fixed-length ``{"input_ids", "labels"}`` int64 windows (see module docstring).

    Args:
        path: file prefix or directory (see :func:`resolve_prefix`).
        max_seq_length: L, tokens per sample.
        start, end: keep only samples ``[start, end)`` of the packed sequence; used to hold out a
            contiguous tail for evaluation (:meth:`split`) without copying anything.
    """

    def __init__(self, path, max_seq_length, start=0, end=None):
        self.prefix = resolve_prefix(path)
        # mmap: opening is O(1) and each rank only pages in the windows it reads.
        self.ids = np.load(self.prefix + ".ids.npy", mmap_mode="r")
        self.doc_offsets = np.load(self.prefix + ".idx.npy")
        meta_path = self.prefix + ".meta.json"
        self.meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        if max_seq_length < 1:
            raise ValueError("max_seq_length must be >= 1")
        self.max_seq_length = max_seq_length
        total = max(0, (len(self.ids) - 1) // max_seq_length)
        end = total if end is None else min(end, total)
        if not 0 <= start <= end:
            raise ValueError(f"bad sample range [{start}, {end}) of {total}")
        self.start, self.end = start, end

    def __len__(self):
        return self.end - self.start

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        lo = (self.start + i) * self.max_seq_length
        window = np.asarray(self.ids[lo: lo + self.max_seq_length + 1], dtype=np.int64)
        return {"input_ids": window[:-1], "labels": window[1:]}

    def split(self, eval_fraction):
        """(train, eval) views: the last ``eval_fraction`` of the samples (at least one when > 0) is eval."""
        n_eval = int(round(len(self) * eval_fraction))
        if eval_fraction > 0:
            n_eval = min(max(n_eval, 1), len(self) - 1)
        cut = self.start + len(self) - n_eval
        train = PretrainTokenDataset(self.prefix, self.max_seq_length, self.start, cut)
        evals = PretrainTokenDataset(self.prefix, self.max_seq_length, cut, self.end)
        return train, evals

    @property
    def num_tokens(self):
        return len(self.ids)

    @property
    def num_docs(self):
        return len(self.doc_offsets) - 1
