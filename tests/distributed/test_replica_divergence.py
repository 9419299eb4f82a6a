"""``replica_check_steps`` on real launches through the public Trainer (``workers/replica_worker.py``; dp2,
sharding stage1x2, stage3 dp2xsharding2): rank 1 changes one bit of its copy after the gradient sync and the check
stops the run within ``replica_check_steps`` steps naming the step, the ranks and the parameter, on every rank; under
``nan_inf_policy=rollback`` the run rolls back instead and ends with the replicas equal again; a clean run with
the check on has bit-identical losses to one with it off."""
from __future__ import annotations

from launcher import launch, read_results

WORKER = "replica_worker.py"
MAX_STEPS, EVERY = 8, 2


def run_layout(tmp_path, *extra):
    launch(WORKER, 2, ["--out_dir", tmp_path / "out", "--result_dir", tmp_path / "res", *extra], tmp_path, timeout=300)
    logs = {p.name: p.read_text(errors="replace") for p in (tmp_path / "logs").glob("workerlog.*")}
    return read_results(tmp_path / "res", 2), logs


def check_results(ranks, logs, corrupt_step, rollback_step, axes):
    caught = corrupt_step + (-corrupt_step) % EVERY  # the first check step at or after the corruption
    for rank in ranks:
        assert rank["on"]["losses"] == rank["off"]["losses"]  # the check changes nothing (bit-identical)
        assert len(rank["on"]["losses"]) == MAX_STEPS and rank["on"]["global_step"] == MAX_STEPS
        error = rank["corrupt"]["error"]
        assert error["step"] == caught and error["ranks"] == [0, 1] and error["parameter"] == "net.0.weight", error
        assert error["message"].startswith(
            f"step {caught}: the {axes} replicas' weights diverged: parameter 'net.0.weight' differs between ranks "
            "[0, 1] (1 of 4 parameters differ; ranks [0, 1] compared, replica_check_steps=2)"), error["message"]
        # the same losses up to the step before the check; the check raises before the check step is logged
        assert rank["corrupt"]["losses"] == rank["off"]["losses"][:caught - 1]
        assert rank["rollback"]["global_step"] == MAX_STEPS and "error" not in rank["rollback"]
    # the replicas are equal again after the rollback, and differed when the error was raised
    assert ranks[0]["rollback"]["fingerprint"] == ranks[1]["rollback"]["fingerprint"]
    assert ranks[0]["corrupt"]["fingerprint"] != ranks[1]["corrupt"]["fingerprint"]
    rolled = rollback_step + (-rollback_step) % EVERY
    for name, text in logs.items():
        assert f"step {rolled}: replica divergence; rolled back to" in text, f"{name} did not roll back"


def test_a_bit_changed_in_one_rank_s_gradient_after_the_sync_stops_dp2_within_the_check_interval(tmp_path):
    ranks, logs = run_layout(tmp_path, "--corrupt", "grad", "--corrupt_step", 3, "--rollback_step", 5)
    check_results(ranks, logs, corrupt_step=3, rollback_step=5, axes="data-parallel")


def test_a_bit_changed_in_one_rank_s_weight_stops_sharding_stage1(tmp_path):
    ranks, logs = run_layout(tmp_path, "--sharding", "stage1", "--corrupt", "weight", "--corrupt_step", 4,
                             "--rollback_step", 6)
    check_results(ranks, logs, corrupt_step=4, rollback_step=6, axes="data-parallel and sharding")


def test_on_dp2_the_check_reads_the_host_only_on_its_own_steps(tmp_path, llama_weights):
    # logging every 3 steps, the check every 2: steps 2 and 4 read for the check alone, step 6 logs and checks
    options = dict(model="llama", weights=llama_weights, num_samples=96, per_device_train_batch_size=2,
                   gradient_accumulation_steps=2, learning_rate=0.01, max_grad_norm=0.5, max_steps=6,
                   logging_steps=3, replica_check_steps=2, save_steps=100, seed=7, disable_tqdm=True,
                   report_to="none", remove_unused_columns=False, output_dir=tmp_path / "out",
                   result_dir=tmp_path / "res")
    launch("host_reads_worker.py", 2, [str(x) for k, v in options.items() for x in (f"--{k}", v)], tmp_path)
    for rank in read_results(tmp_path / "res", 2):
        assert rank["logged_steps"] == [3, 6]
        assert sorted(rank["outside"]) == ["2", "4"], rank["outside"]
        for reads in rank["outside"].values():  # the gathered table: one read, from the check
            assert len(reads) == 1 and "replica_check.py" in reads[0], reads


def test_under_stage3_the_dp_peers_compare_their_slices_and_every_rank_stops_or_rolls_back(tmp_path):
    # dp2 x sharding2, every parameter sliced: rank 1's slice has one dp peer; the other dp group (the other
    # sharding rank's slices) agrees, and stops at the same step all the same (the verdict is all-reduced)
    launch(WORKER, 4, ["--out_dir", tmp_path / "out", "--result_dir", tmp_path / "res", "--sharding", "stage3",
                       "--corrupt", "slice", "--corrupt_step", 3, "--rollback_step", 5], tmp_path, timeout=400)
    ranks = read_results(tmp_path / "res", 4)
    peers = ranks[1]["dp_group"]
    assert 1 in peers and len(peers) == 2
    for r, rank in enumerate(ranks):
        assert rank["on"]["losses"] == rank["off"]["losses"] and rank["rollback"]["global_step"] == MAX_STEPS
        error = rank["corrupt"]["error"]
        assert error["step"] == 4 and rank["corrupt"]["losses"] == rank["off"]["losses"][:3], error
        if r in peers:
            assert error["ranks"] == peers and error["parameter"] == "net.0.weight", error
            assert f"parameter 'net.0.weight' differs between ranks {peers}" in error["message"]
        else:
            assert "replicas of another replica group diverged (rank 1 is one of them" in error["message"], error
    assert ranks[peers[0]]["corrupt"]["fingerprint"] != ranks[peers[1]]["corrupt"]["fingerprint"]
    assert ranks[peers[0]]["rollback"]["fingerprint"] == ranks[peers[1]]["rollback"]["fingerprint"]
    for log in (tmp_path / "logs").glob("workerlog.*"):
        assert "step 6: replica divergence; rolled back to" in log.read_text(errors="replace"), log.name
