"""Topology arithmetic and strategy construction, checked without launching processes."""
import itertools
import pytest

from paddletrainer.parallel import topology as topo_mod
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.topology import Topology, build_strategy, coordinates_of, hybrid_order


def _args(world=1, dp=1, sharding=1, tp=1, pp=1, topo_order="pp_first", **options):
    """A ParallelConfig (what init_topology and build_strategy take) for these degrees."""
    layout = Layout(world_size=world, dp=dp, sharding=sharding, tp=tp, pp=pp, topo_order=topo_order)
    options.setdefault("sharding_stage", 1 if sharding > 1 else 0)
    return ParallelConfig(layout=layout, accumulate_steps=4, micro_batch_size=2, seed=7, **options)


FLEET_NAMES = {"dp": "data", "pp": "pipe", "sharding": "sharding", "sep": "sep", "cp": "context", "mp": "model"}


@pytest.mark.parametrize("order_name", ["pp_first", "sharding_first"])
@pytest.mark.parametrize("dp,sharding,tp,pp", [(2, 2, 2, 2), (1, 2, 2, 2), (2, 1, 2, 2), (4, 1, 2, 1), (1, 4, 1, 2)])
def test_coordinates_of_matches_fleet_communicate_topology(order_name, dp, sharding, tp, pp):
    from paddle.distributed.fleet.base.topology import CommunicateTopology

    order = hybrid_order(order_name)
    degrees = {"dp": dp, "sharding": sharding, "mp": tp, "pp": pp}
    fleet_topo = CommunicateTopology([FLEET_NAMES[a] for a in order], [degrees.get(a, 1) for a in order])
    for rank in range(dp * sharding * tp * pp):
        ours = coordinates_of(rank, degrees, order)
        theirs = fleet_topo.get_coord(rank)
        assert [ours[a] for a in order] == list(theirs)


def test_coordinates_of_worked_example_and_tp_alias():
    # strides 8, 4, 2, 1 over (dp, pp, sharding, mp): 13 = 1*8 + 1*4 + 0*2 + 1*1
    coords = coordinates_of(13, {"dp": 2, "pp": 2, "sharding": 2, "tp": 2}, ("dp", "pp", "sharding", "mp"))
    assert coords == {"dp": 1, "pp": 1, "sharding": 0, "mp": 1}


def test_coordinates_of_rejects_rank_outside_world():
    with pytest.raises(ValueError, match="outside a world of 4"):
        coordinates_of(4, {"dp": 2, "mp": 2}, hybrid_order("pp_first"))


def test_hybrid_order_rejects_unknown_name():
    with pytest.raises(ValueError, match="pp_first"):
        hybrid_order("tp_first")


def test_data_rank_and_world_follow_paddlenlp_dataset_rank():
    for dp_rank, sharding_rank in itertools.product(range(2), range(4)):
        t = Topology.of(world_size=16, rank=0, local_rank=0, dp_degree=2, sharding_degree=4, tp_degree=2, pp_degree=1,
                        dp_rank=dp_rank, sharding_rank=sharding_rank, tp_rank=1, pp_rank=0)
        assert t.data_rank == dp_rank * 4 + sharding_rank
        assert t.data_world_size == 8
        assert t.is_first_stage and t.is_last_stage
        assert t.hcg is None and t.tp_group is None and not t.use_hybrid


def test_strategy_carries_degrees_order_pipeline_and_tp_seed():
    strategy = build_strategy(_args(world=16, dp=2, sharding=2, tp=2, pp=2, topo_order="sharding_first"),
                              on_cpu=True)
    hc = strategy.hybrid_configs
    assert (hc["dp_degree"], hc["mp_degree"], hc["pp_degree"], hc["sharding_degree"]) == (2, 2, 2, 2)
    assert list(strategy.hybrid_parallel_order) == list(hybrid_order("sharding_first"))
    pc = strategy.pipeline_configs
    assert pc["accumulate_steps"] == 4 and pc["micro_batch_size"] == 2
    assert pc["enable_partial_send_recv"] is False  # gloo has no all_gather_partial
    assert strategy.tensor_parallel_configs["tensor_init_seed"] == 7
    assert hc["sharding_configs"].accumulate_steps == 4 and not hc["sharding_configs"].split_param


def test_partial_send_recv_stays_on_off_cpu_unless_disabled():
    assert build_strategy(_args(world=2, pp=2), on_cpu=False).pipeline_configs["enable_partial_send_recv"] is True
    off = _args(world=2, pp=2, pipeline_options=frozenset({"disable_partial_send_recv"}))
    assert build_strategy(off, on_cpu=False).pipeline_configs["enable_partial_send_recv"] is False


@pytest.fixture
def fresh_topology():
    topo_mod.reset_for_tests()
    yield
    topo_mod.reset_for_tests()


def test_init_topology_single_process_builds_no_groups(fresh_topology):
    t = topo_mod.init_topology(_args())
    assert (t.world_size, t.rank, t.data_rank, t.data_world_size) == (1, 0, 0, 1)
    assert t.hcg is None and t.data_group is None
    assert topo_mod.init_topology(_args()) is t  # idempotent
    with pytest.raises(RuntimeError, match="already ran"):
        topo_mod.init_topology(_args(world=2, dp=2))


def test_init_topology_rejects_mismatched_degrees_before_fleet_init(monkeypatch, fresh_topology):

    def fail(*a, **k):
        raise AssertionError("fleet.init must not be reached")

    from paddle.distributed import fleet

    monkeypatch.setattr(fleet, "init", fail)
    with pytest.raises(ValueError, match="do not match the world size 8"):
        topo_mod.init_topology(_args(world=8, dp=2, tp=2))
    with pytest.raises(ValueError, match="launcher started 1 processes"):
        topo_mod.init_topology(_args(world=4, dp=2, tp=2))
    assert topo_mod.get_topology() is None


def test_cpu_only_options_are_rejected_with_clear_errors():
    topo_mod.check_cpu_options(_args(sharding_options=frozenset({"split_param"})))  # stage1 V2 runs (cpu/sharding_construction.py's alignment)
    with pytest.raises(NotImplementedError, match="enable_timer needs CUDA"):
        topo_mod.check_cpu_options(_args(pipeline_options=frozenset({"enable_timer"})))
    topo_mod.check_cpu_options(_args(sequence_parallel=True))  # runs on the CPU reduce-scatter (cpu/reduce_scatter.py)


# ------------------------------------------------------------------ the layout type, addressed by axis name
def test_layout_coordinates_data_rank_and_names_follow_the_axes_table():
    from paddletrainer.parallel.layout import AXES

    layout = Layout(world_size=16, dp=2, sharding=2, tp=2, pp=2)
    assert [a.name for a in AXES] == ["dp", "sharding", "tp", "pp", "sep", "cp"]
    for rank in range(16):
        fleet = coordinates_of(rank, {"dp": 2, "sharding": 2, "mp": 2, "pp": 2}, hybrid_order("pp_first"))
        ours = layout.coordinates(rank)
        assert ours == {"dp": fleet["dp"], "sharding": fleet["sharding"], "tp": fleet["mp"], "pp": fleet["pp"], "sep": 0,
                        "cp": 0}
        assert layout.data_rank(ours) == ours["dp"] * 2 + ours["sharding"]
    # what checkpoints already on disk use: the recorded layout and the per-rank file names
    assert layout.as_dict() == {"world_size": 16, "dp_degree": 2, "sharding_degree": 2, "tp_degree": 2, "pp_degree": 2}
    assert layout.cell_name({"dp": 1, "sharding": 0, "tp": 1, "pp": 0}) == "dp01_shard00_tp01_pp00"
    assert layout.fleet_degrees() == {"dp_degree": 2, "sharding_degree": 2, "mp_degree": 2, "pp_degree": 2}
    assert (layout.data_world_size, layout.degree("mp"), layout.use_hybrid) == (4, 2, True)


def test_layout_refuses_degrees_that_do_not_multiply_to_the_world():
    with pytest.raises(ValueError, match=r"dp2·sharding1·tp2·pp1 = 4 do not match the world size 8"):
        Layout(world_size=8, dp=2, tp=2)


def test_topology_has_degree_rank_and_group_attributes_for_every_axis():
    from paddletrainer.parallel.layout import AXES

    t = Topology.of(rank=5, dp_degree=2, tp_degree=2, pp_degree=2, groups={"tp": "tp-group"})
    for a in AXES:
        assert getattr(t, f"{a.name}_degree") == t.degree(a.name)
        assert getattr(t, f"{a.name}_rank") == t.coord(a.name) == t.layout.coordinates(5)[a.name]
    assert t.tp_group == t.group("tp") == "tp-group" and t.dp_group is None


def test_reset_for_tests_forgets_the_topology_and_the_store_priming(fresh_topology):
    import socket

    from paddletrainer.parallel import tcp_store

    first = topo_mod.init_topology(_args())
    with socket.socket() as server:  # a listening socket is enough to prime against
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        assert tcp_store.prime_disconnect_logging(*server.getsockname()) is True
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    assert tcp_store.prime_disconnect_logging("127.0.0.1", closed_port) is True  # primed once per process
    topo_mod.reset_for_tests()
    assert topo_mod.get_topology() is None
    with pytest.warns(UserWarning, match="could not reach the TCP store"):
        assert tcp_store.prime_disconnect_logging("127.0.0.1", closed_port) is False
    again = topo_mod.init_topology(_args())
    assert again is not first and topo_mod.get_topology() is again
