"""Two nodes on one machine: two ``paddle.distributed.launch --nnodes 2 --master 127.0.0.1:<port>`` processes
of 2 ranks each (dp2 · tp2, a tiny Llama through the public Trainer).

Node-local vs global rank logic: ``local_process_index`` restarts at 0 on node 1; ``should_log`` is true
on each node's first process with ``log_on_each_node`` (default) and only on process 0 without it;
``should_save`` the other way round with ``save_on_each_node``; and the files and printed metrics follow
them. Each node gets its own ``output_dir`` (standing for node-local disks). The losses equal one process.
"""
from __future__ import annotations

from launcher import launch_nodes, read_results
from trainer_phases import WORKER, assert_curve, phase_args


def test_two_nodes_rank_logic_logging_saving_and_losses_match_one_process(tmp_path, trainer_reference, llama_weights):
    ref, _ = trainer_reference("llama")
    res = tmp_path / "res"
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    elapsed, log_dirs = launch_nodes(WORKER, 2, [
        phase_args("llama", node, res, llama_weights, per_device_train_batch_size=2, tensor_parallel_degree=2,
                   save_steps=1000, extended_steps=0, node_files=True)
        for node in nodes], tmp_path)
    print(f"two-node launch: {elapsed:.0f}s")
    ranks = read_results(res, 4)
    facts = [r["node"] for r in ranks]
    assert [f["process_index"] for f in facts] == [0, 1, 2, 3]
    assert [f["local_process_index"] for f in facts] == [0, 1, 0, 1]
    assert [f["is_local_process_zero"] for f in facts] == [True, False, True, False]
    assert [f["is_world_process_zero"] for f in facts] == [True, False, False, False]
    # log_on_each_node=True (default), save_on_each_node=False (default) ...
    assert [f["should_log"] for f in facts] == [True, False, True, False]
    assert [f["should_save"] for f in facts] == [True, False, False, False]
    # ... and flipped
    assert [f["flipped"]["should_log"] for f in facts] == [True, False, False, False]
    assert [f["flipped"]["should_save"] for f in facts] == [True, False, True, False]

    # what was written and printed follows them: save_state (only process 0), then save_metrics (each node)
    assert (nodes[0] / "short" / "trainer_state.json").exists()
    assert not (nodes[1] / "short" / "trainer_state.json").exists()
    assert (nodes[0] / "short" / "flipped_results.json").exists() and (nodes[1] / "short" / "flipped_results.json").exists()
    printed = {(n, log.name): "***** node metrics *****" in log.read_text(errors="replace")
               for n, log_dir in enumerate(log_dirs) for log in log_dir.glob("workerlog.*")}
    assert sorted(k for k, v in printed.items() if v) == [(0, "workerlog.0"), (1, "workerlog.0")], printed

    for r in ranks:
        assert_curve(r["short"], ref["short"], 3, f"rank {r['rank']}")
        assert abs(r["short"]["eval_loss"] - ref["short"]["direct_eval_loss"]) <= 1e-5 * ref["short"]["direct_eval_loss"]
