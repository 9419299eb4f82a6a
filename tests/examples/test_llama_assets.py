"""The Llama example's bundled corpus and tokenizer are exactly what their generator scripts produce."""
import sentencepiece as spm

from .helpers import LLAMA, REPO, run_script


def pieces(model_path):
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


def test_corpus_regenerates_byte_for_byte(tmp_path):
    run_script([LLAMA / "data" / "make_corpus.py", "--output", tmp_path / "corpus.txt"], cwd=REPO)
    assert (tmp_path / "corpus.txt").read_bytes() == (LLAMA / "data" / "corpus.txt").read_bytes()


def test_tokenizer_retrains_to_the_same_pieces(tmp_path):
    # The .model file also records the training paths, so compare what matters: pieces and scores.
    run_script([LLAMA / "data" / "train_tokenizer.py", "--output_dir", tmp_path], cwd=REPO)
    assert pieces(tmp_path / "sentencepiece.bpe.model") == pieces(LLAMA / "tiny_llama" / "sentencepiece.bpe.model")
    assert (tmp_path / "tokenizer_config.json").read_bytes() == (LLAMA / "tiny_llama" / "tokenizer_config.json").read_bytes()
