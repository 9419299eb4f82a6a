"""Two data ranks on a finite stream shorter than max_steps: both stop at the same step, with the warning,
and the job ends (it hung before: the loop kept starting empty epochs)."""
from launcher import launch, read_results


def test_a_finite_stream_stops_both_data_ranks_at_the_same_step(tmp_path):
    # 10 items, 1 per rank per step: 5 steps; max_steps=11 asks for more than the stream holds
    launch("finite_stream_worker.py", 2, ["--output_dir", tmp_path / "out", "--result_dir", tmp_path,
                                           "--num_samples", 10, "--max_steps", 11, "--per_device_train_batch_size",
                                           1, "--save_strategy", "no", "--report_to", "none", "--disable_tqdm",
                                           "true", "--device", "cpu"], tmp_path, timeout=240)
    results = read_results(tmp_path, 2)
    assert [r["global_step"] for r in results] == [5, 5]
    assert [r["forward_calls"] for r in results] == [5, 5]
    for r in results:
        assert any("yielded no batch" in w and "step 5" in w for w in r["warnings"]), r["warnings"]
