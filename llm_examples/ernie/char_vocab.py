"""Build an ERNIE character vocabulary from training text, so a model trained from scratch needs no download.

The tokens are what paddlenlp's ``ErnieTokenizer`` would look up: its ``BasicTokenizer`` (lower-casing,
every CJK character and punctuation mark its own token) splits the text, and every other word (Latin,
digits) is spelled as its first character plus ``##``-continuations, so the WordPiece step always finds
a match. Tokens seen fewer than ``min_freq`` times become ``[UNK]``.
"""
import json
import os
import tempfile
from collections import Counter

SPECIAL_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


def vocab_tokens(texts, min_freq=2):
    """Special tokens, then the kept tokens by decreasing count (ties alphabetical: deterministic)."""
    from paddlenlp.transformers import BasicTokenizer  # the splitting rules ErnieTokenizer uses

    basic = BasicTokenizer(do_lower_case=True)
    counts = Counter()
    for text in texts:
        for word in basic.tokenize(text):
            counts[word[0]] += 1
            counts.update("##" + ch for ch in word[1:])
    kept = sorted((tok for tok, n in counts.items() if n >= min_freq and tok not in SPECIAL_TOKENS),
                  key=lambda tok: (-counts[tok], tok))
    return SPECIAL_TOKENS + kept


def write_tokenizer_dir(tokens, directory, model_max_length=512):
    """``vocab.txt`` + ``tokenizer_config.json``: ``AutoTokenizer.from_pretrained(directory)`` loads it offline."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    config = {"tokenizer_class": "ErnieTokenizer", "do_lower_case": True, "unk_token": "[UNK]",
              "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
              "model_max_length": model_max_length}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    return directory


def tokenizer_scratch_dir() -> tempfile.TemporaryDirectory:
    """A temporary directory for the tokenizer files a script builds, removed when its ``with`` block ends.

    Keep it open until the model is saved: ``save_pretrained`` (``Trainer.save_model``) copies ``vocab.txt``
    from the directory the tokenizer was loaded from.
    """
    return tempfile.TemporaryDirectory(prefix="ernie_vocab_")
