"""The bundled tokenizers and model configs load from the repo with the network refused."""
import json

import pytest

from .helpers import ERNIE, LLAMA, load_module

pytestmark = pytest.mark.usefixtures("no_network")


def test_tiny_ernie_tokenizer_covers_the_whole_sample_and_matches_the_config():
    from paddlenlp.transformers import AutoTokenizer, ErnieTokenizer

    chnsenticorp = load_module(ERNIE / "chnsenticorp.py", "chnsenticorp")
    tok = AutoTokenizer.from_pretrained(str(ERNIE / "tiny_ernie"))
    assert isinstance(tok, ErnieTokenizer)
    assert len(ErnieTokenizer(str(ERNIE / "tiny_ernie" / "vocab.txt"))) == len(tok)
    assert json.loads((ERNIE / "tiny_ernie" / "config.json").read_text())["vocab_size"] == len(tok)
    for split in ("train", "dev", "test"):
        for ex in chnsenticorp.load_split(ERNIE / "data", split):
            ids = tok(ex["text"])["input_ids"]
            assert tok.unk_token_id not in ids, ex["text"]
            assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    # ascii words are spelled with ##-pieces rather than collapsing to [UNK]
    assert tok.convert_ids_to_tokens(tok("GPU 3")["input_ids"])[1:-1] == ["g", "##p", "##u", "3"]


def test_tiny_ernie_config_builds_a_random_init_classifier():
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    model = ErnieForSequenceClassification(ErnieConfig.from_pretrained(str(ERNIE / "tiny_ernie"), num_labels=2))
    assert model.classifier.weight.shape == [64, 2]


def test_tiny_llama_tokenizer_loads_and_matches_the_config():
    from paddlenlp.transformers import AutoTokenizer, LlamaTokenizer

    tok = AutoTokenizer.from_pretrained(str(LLAMA / "tiny_llama"))
    assert isinstance(tok, LlamaTokenizer)
    assert json.loads((LLAMA / "tiny_llama" / "config.json").read_text())["vocab_size"] == len(tok) == 640
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "Anna found a shiny kite. Ünïcode and 中文 fall back to bytes."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text


def test_llama_7b_reference_config_has_the_real_shape():
    from paddlenlp.transformers import LlamaConfig

    cfg = LlamaConfig.from_pretrained(str(LLAMA / "configs" / "llama-7b"))
    shape = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.vocab_size)
    assert shape == (4096, 11008, 32, 32, 32000)
