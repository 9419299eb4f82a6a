"""The cost model's expert-parallel row (``planning.cost_model.moe_all_to_all``, printed by scripts/cost_model.py
``--ep``): the token exchange of one MoE layer."""
from paddletrainer.planning import cost_model as cm


def test_moe_all_to_all_counts_four_exchanges_of_every_routed_row_and_the_share_leaving_the_rank():
    row = cm.moe_all_to_all(tokens=4096, hidden=1024, top_k=2, ep=4, bytes_per_value=2)
    assert row["payload"] == 4 * 4096 * 2 * 1024 * 2  # dispatch + combine, forward and backward
    assert row["min_wire"] == row["payload"] * 3 // 4  # 1/ep of the rows stay on the rank
    assert cm.moe_all_to_all(tokens=8, hidden=4, top_k=1, ep=1)["min_wire"] == 0
