"""virtual_pp_degree: the layer-count rule checked before a ``...Pipe`` model (and any process group) exists."""
import pytest

from paddletrainer.parallel.pipeline import check_virtual_pipeline_split


def test_layers_must_divide_into_pp_times_vpp_chunks():
    check_virtual_pipeline_split(4, 2, 2)
    check_virtual_pipeline_split(8, 4, 2)
    check_virtual_pipeline_split(5, 2, 1)  # no interleaving: the plain pipeline rules apply elsewhere
    with pytest.raises(ValueError, match=r"num_hidden_layers=6 is not divisible by pipeline_parallel_degree=2 x "
                                         r"virtual_pp_degree=2 = 4"):
        check_virtual_pipeline_split(6, 2, 2)
