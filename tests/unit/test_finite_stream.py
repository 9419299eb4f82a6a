"""A finite stream (``paddle.io.IterableDataset``) that runs out before ``max_steps`` ends training with a warning
(PaddleNLP's and Hugging Face's ``test_training_finite_iterable_dataset``), and no DataLoader reader thread is left
behind by a loop that stops before its stream ends.

The training runs in a child process with a timeout, so a hang fails the test instead of blocking the suite.
"""
import json
import os
import subprocess
import sys

UNIT_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(UNIT_DIR))

CHILD = r'''
import json, logging, sys, threading
import paddle
from toy_models import RegressionModel, regression_data
from paddletrainer import Trainer, TrainingArguments

class FiniteStream(paddle.io.IterableDataset):
    """HF's FiniteIterableDataset: one pass over ``n`` samples, then every later pass is empty."""
    def __init__(self, n):
        self.data, self.current = regression_data(n), 0
    def __iter__(self):
        while self.current < len(self.data):
            yield self.data[self.current]
            self.current += 1

class Counting(RegressionModel):
    calls = 0
    def forward(self, x, labels=None):
        Counting.calls += 1
        return super().forward(x, labels)

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("paddletrainer").addHandler(Keep(logging.WARNING))

n, max_steps, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
args = TrainingArguments(out_dir, max_steps=max_steps, per_device_train_batch_size=1, disable_tqdm=True,
                         report_to="none", save_strategy="no", logging_steps=1)
out = Trainer(Counting(), args=args, train_dataset=FiniteStream(n)).train()
readers = [t.name for t in threading.enumerate() if "_thread_loop" in t.name and t.is_alive()]
print("RESULT " + json.dumps({"global_step": out.global_step, "forward_calls": Counting.calls,
                              "warnings": warnings, "readers": readers}))
'''


def run_child(tmp_path, n, max_steps):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, UNIT_DIR, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(n), str(max_steps), str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_stream_shorter_than_max_steps_stops_with_a_warning(tmp_path):
    result = run_child(tmp_path, n=10, max_steps=11)
    assert result["global_step"] == 10
    assert result["forward_calls"] == 10
    assert any("yielded no batch" in w and "step 10" in w for w in result["warnings"]), result["warnings"]
    assert result["readers"] == []


def test_a_loop_stopped_before_the_stream_ends_leaves_no_reader_thread(tmp_path):
    # 100 samples, 3 steps: the loop leaves the iterator with its prefetch queue full
    result = run_child(tmp_path, n=100, max_steps=3)
    assert result["global_step"] == 3 and result["forward_calls"] == 3
    assert not any("yielded no batch" in w for w in result["warnings"])
    assert result["readers"] == []
