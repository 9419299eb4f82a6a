"""merge_checkpoint output loads with PaddleNLP's Auto classes and computes the same outputs."""
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint import save_checkpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "merge_checkpoint.py")


def tiny_config():
    from paddlenlp.transformers import LlamaConfig

    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)


def merge(ckpt, out, *extra):
    subprocess.run([sys.executable, SCRIPT, ckpt, out, *extra], check=True, stdout=subprocess.PIPE)


@pytest.mark.parametrize("auto_name", ["AutoModelForCausalLM", "AutoModelForSequenceClassification"])
def test_merged_checkpoint_loads_with_from_pretrained_and_matches(tmp_path, auto_name):
    import paddlenlp.transformers as T

    if auto_name == "AutoModelForCausalLM":
        model = T.LlamaForCausalLM(tiny_config())
    else:  # paddlenlp 3.0.0b4 has no Llama classifier; ERNIE is the usual PaddleNLP one
        cfg = T.ErnieConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=32, num_labels=3)
        model = T.ErnieForSequenceClassification(cfg)
    model.eval()
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    merge(ckpt, str(tmp_path / "merged"))
    assert sorted(os.listdir(tmp_path / "merged")) == ["config.json", "model.safetensors"]
    loaded = getattr(T, auto_name).from_pretrained(str(tmp_path / "merged"))
    loaded.eval()
    assert type(loaded) is type(model)
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    ids = paddle.to_tensor([[1, 5, 7, 9, 11]])
    out_a, out_b = model(ids), loaded(ids)
    out_a = out_a[0] if isinstance(out_a, (tuple, list)) else out_a
    out_b = out_b[0] if isinstance(out_b, (tuple, list)) else out_b
    np.testing.assert_array_equal(out_a.numpy(), out_b.numpy())


def test_config_from_a_model_dir_is_copied(tmp_path):
    model = paddle.nn.Linear(4, 2)  # a model without a PaddleNLP config
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, SCRIPT, ckpt, str(tmp_path / "m1")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text('{"model_type": "x"}')
    merge(ckpt, str(tmp_path / "m2"), "--config-from", str(tmp_path / "cfg"))
    assert (tmp_path / "m2" / "config.json").read_text() == '{"model_type": "x"}'
    from safetensors.numpy import load_file

    w = load_file(str(tmp_path / "m2" / "model.safetensors"))
    np.testing.assert_array_equal(w["weight"], model.weight.numpy())
