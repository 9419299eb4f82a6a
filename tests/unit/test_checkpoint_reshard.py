"""Reading slices of stored pieces into other placements (box and stage-3 flat pieces), from real files."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint.read import PieceReader
from paddletrainer.checkpoint.reshard import read_placement, relative_slices

FULL = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)


def write_pieces(tmp_path, pieces):
    """pieces: [(file, Placement)] of FULL; returns the index built by the real build_index."""
    entries = []
    for i, (fname, pl) in enumerate(pieces):
        box = FULL[relative_slices(pl.offsets, pl.shape, (0, 0))]
        data = box.reshape(-1)[pl.flat[0]: pl.flat[1]] if pl.flat else box
        save_file({L.file_key("model/w"): np.ascontiguousarray(data)}, str(tmp_path / fname))
        entries.append(L.PieceEntry("model/w", "float32", pl, i, fname))
    return L.build_index(entries, {f: {"size": 0, "crc32": 0} for f, _ in pieces}, {})


def read(tmp_path, index, target):
    return read_placement(index, "model/w", target, PieceReader(str(tmp_path)))


def test_column_shards_load_as_full_and_as_row_shards(tmp_path):
    index = write_pieces(tmp_path, [(f"c{r}.safetensors", L.tp_placement((8, 3), 1, r, 2)) for r in range(2)])
    np.testing.assert_array_equal(read(tmp_path, index, L.replicated((8, 6))), FULL)
    for r in range(2):
        np.testing.assert_array_equal(read(tmp_path, index, L.tp_placement((4, 6), 0, r, 2)), FULL[4 * r: 4 * r + 4])
    np.testing.assert_array_equal(read(tmp_path, index, L.tp_placement((8, 2), 1, 1, 3)), FULL[:, 2:4])


def test_flat_stage3_pieces_load_as_boxes_and_as_other_flat_ranges(tmp_path):
    box = L.replicated((8, 6))
    index = write_pieces(tmp_path, [("f0.safetensors", L.flat_placement(box, 0, 17)),
                                    ("f1.safetensors", L.flat_placement(box, 17, 48))])
    np.testing.assert_array_equal(read(tmp_path, index, box), FULL)
    np.testing.assert_array_equal(read(tmp_path, index, L.tp_placement((8, 3), 1, 1, 2)), FULL[:, 3:])
    np.testing.assert_array_equal(read(tmp_path, index, L.flat_placement(box, 10, 30)), FULL.reshape(-1)[10:30])


def test_flat_slices_of_tp_boxes_reassemble(tmp_path):
    """stage 3 on top of tensor parallel: each tp box is flat-sliced over two sharding ranks."""
    pieces = []
    for tp in range(2):
        b = L.tp_placement((4, 6), 0, tp, 2)
        pieces += [(f"t{tp}s0.safetensors", L.flat_placement(b, 0, 11)), (f"t{tp}s1.safetensors", L.flat_placement(b, 11, 24))]
    index = write_pieces(tmp_path, pieces)
    np.testing.assert_array_equal(read(tmp_path, index, L.replicated((8, 6))), FULL)
    np.testing.assert_array_equal(read(tmp_path, index, L.tp_placement((8, 3), 1, 0, 2)), FULL[:, :3])


def test_a_hole_in_the_pieces_is_an_error_naming_the_tensor(tmp_path):
    box = L.replicated((8, 6))
    pieces = [("f0.safetensors", L.flat_placement(box, 0, 17)), ("f1.safetensors", L.flat_placement(box, 17, 48))]
    index = write_pieces(tmp_path, pieces)
    index["tensors"]["model/w"]["pieces"].pop()  # as if a rank's file were dropped from the index
    with pytest.raises(L.CheckpointError, match="model/w: 31 elements"):
        read(tmp_path, index, box)
