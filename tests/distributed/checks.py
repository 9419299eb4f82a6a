"""Assertions shared by the distributed tests."""
import numpy as np

RTOL = 1e-5
MLP_MAX_NORM = 5.0  # the MLP's grad norms are 3.1..7.8: steps 2 and 3 are clipped
LLAMA_MAX_NORM = 0.8  # the tiny Llama's grad norms are 0.66..0.85: steps 1 and 2 are clipped


def assert_matches_single_process(results, reference, max_norm):
    """Every rank reports the single-process losses, grad norms and eval loss (to RTOL); clipping was exercised."""
    assert any(n > max_norm for n in reference["grad_norms"]), "the reference never clips: pick a lower max_norm"
    for r in results:
        np.testing.assert_allclose(r["losses"], reference["losses"], rtol=RTOL, err_msg=f"losses of rank {r['rank']}")
        np.testing.assert_allclose(r["grad_norms"], reference["grad_norms"], rtol=RTOL,
                                   err_msg=f"grad norms of rank {r['rank']}")
        np.testing.assert_allclose(r["eval_loss"], reference["eval_loss"], rtol=RTOL,
                                   err_msg=f"eval loss of rank {r['rank']}")


def assert_about_half(value, full, what):
    """A sharding rank holds 40..60% of the single-process bytes (whole tensors are assigned greedily)."""
    assert 0.4 * full <= value <= 0.6 * full, f"{what}: {value} bytes vs {full} in one process"


def assert_coordinates(results, **degrees):
    """The ranks cover every (dp, sharding, tp, pp) coordinate exactly once."""
    seen = {(r["dp_rank"], r["sharding_rank"], r["tp_rank"], r["pp_rank"]) for r in results}
    expected = 1
    for d in degrees.values():
        expected *= d
    assert len(seen) == len(results) == expected
