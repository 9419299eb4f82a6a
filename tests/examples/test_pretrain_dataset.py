"""paddletrainer.data.pretrain.PretrainTokenDataset: fixed-length windows packed from the token file."""
import numpy as np
import pytest

from . import helpers  # noqa: F401  (puts the checkout on sys.path)
from paddletrainer.data.pretrain import PretrainTokenDataset, resolve_prefix


@pytest.fixture
def token_files(tmp_path):
    """103 tokens 0..102 in two 'documents', written in the tool's format."""
    ids = np.arange(103, dtype=np.uint16)
    np.save(tmp_path / "corpus.ids.npy", ids)
    np.save(tmp_path / "corpus.idx.npy", np.array([0, 45, 103], dtype=np.int64))
    return tmp_path / "corpus"


def test_windows_are_contiguous_and_labels_are_inputs_shifted_by_one(token_files):
    ds = PretrainTokenDataset(str(token_files), max_seq_length=10)
    assert len(ds) == (103 - 1) // 10 == 10
    for i in range(len(ds)):
        sample = ds[i]
        assert sample["input_ids"].dtype == np.int64 and sample["labels"].dtype == np.int64
        assert sample["input_ids"].tolist() == list(range(10 * i, 10 * i + 10))
        assert sample["labels"].tolist() == list(range(10 * i + 1, 10 * i + 11))


def test_windows_cross_document_boundaries_and_the_short_tail_is_dropped(token_files):
    ds = PretrainTokenDataset(str(token_files), max_seq_length=10)
    assert {44, 45} <= set(ds[4]["input_ids"].tolist())  # doc 0 ends at 44, doc 1 starts at 45
    assert ds[-1]["labels"][-1] == 100  # tokens 101, 102 cannot fill a window
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_split_holds_out_a_disjoint_tail(token_files):
    ds = PretrainTokenDataset(str(token_files), max_seq_length=10)
    train, evals = ds.split(0.2)
    assert (len(train), len(evals)) == (8, 2)
    assert evals[0]["input_ids"].tolist() == ds[8]["input_ids"].tolist()
    assert train[7]["input_ids"].tolist() == ds[7]["input_ids"].tolist()
    assert len(ds.split(0.0)[1]) == 0 and len(ds.split(0.001)[1]) == 1


def test_directory_prefix_and_file_name_all_resolve_to_the_same_files(token_files, tmp_path):
    assert resolve_prefix(str(tmp_path)) == resolve_prefix(str(token_files)) == str(token_files)
    assert resolve_prefix(str(token_files) + ".ids.npy") == str(token_files)
    with pytest.raises(FileNotFoundError, match="build it with paddletrainer-build-pretrain-data$"):
        resolve_prefix(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="exactly one"):
        resolve_prefix(str(tmp_path / "empty"))


def test_the_token_file_is_memory_mapped_not_loaded(token_files):
    ds = PretrainTokenDataset(str(token_files), max_seq_length=10)
    assert isinstance(ds.ids, np.memmap)
    assert (ds.num_tokens, ds.num_docs) == (103, 2)
