"""AMP settings reach Paddle as configured; on CPU fp16/bf16 is an error unless a dry run is asked for."""
import paddle
import pytest

from paddletrainer.optim.amp import AmpConfig
from paddletrainer.training_args import TrainingArguments


def amp_args(**kw):
    """The AMP settings the arguments build (``args.amp_config``) for these options."""
    return TrainingArguments(output_dir="unused", **kw).amp_config


def test_fp16_on_a_cpu_only_build_is_a_clear_error_naming_the_flag():
    with pytest.raises(ValueError, match="fp16=True needs a GPU.*amp_on_cpu fp32_dry_run"):
        AmpConfig.for_device(amp_args(fp16=True), device_has_amp=False)


def test_bf16_dry_run_on_cpu_wires_amp_and_warns(caplog):
    cfg = AmpConfig.for_device(amp_args(bf16=True, fp16_opt_level="O2", amp_on_cpu="fp32_dry_run"), device_has_amp=False)
    assert cfg.enabled and cfg.dry_run and cfg.dtype == "bfloat16" and not cfg.use_scaler
    with caplog.at_level("WARNING"):
        cfg.warn_if_dry_run()
    assert "AMP DRY RUN" in caplog.text


def test_autocast_decorate_and_scaler_receive_the_configured_settings(monkeypatch):
    seen = {}
    monkeypatch.setattr(paddle.amp, "auto_cast", lambda **kw: seen.setdefault("auto_cast", kw) and None or __import__("contextlib").nullcontext())
    monkeypatch.setattr(paddle.amp, "decorate", lambda **kw: seen.setdefault("decorate", kw) and (kw["models"], kw["optimizers"]))
    real_scaler = paddle.amp.GradScaler
    monkeypatch.setattr(paddle.amp, "GradScaler", lambda **kw: seen.setdefault("scaler", kw) and real_scaler(**kw))
    cfg = AmpConfig.for_device(
        amp_args(fp16=True, fp16_opt_level="O2", amp_custom_white_list=["matmul"], amp_custom_black_list=["softmax"],
                 scale_loss=1024.0, amp_master_grad=True, amp_on_cpu="fp32_dry_run"),
        device_has_amp=False,
    )
    with cfg.autocast():
        pass
    model = paddle.nn.Linear(2, 2)
    cfg.decorate(model, "opt")
    cfg.grad_scaler()
    assert seen["auto_cast"] == dict(enable=True, custom_white_list=["matmul"], custom_black_list=["softmax"], level="O2", dtype="float16")
    assert seen["decorate"]["level"] == "O2" and seen["decorate"]["dtype"] == "float16" and seen["decorate"]["master_grad"] is True
    assert seen["scaler"] == dict(init_loss_scaling=1024.0, use_dynamic_loss_scaling=True)


def test_no_amp_flags_means_plain_fp32_and_no_scaler():
    cfg = AmpConfig.for_device(amp_args())
    assert not cfg.enabled and cfg.grad_scaler() is None


def test_fp16_dry_run_scaler_is_live_on_cpu_scales_unscales_and_halves_on_overflow():
    cfg = AmpConfig.for_device(amp_args(fp16=True, scale_loss=1024.0, amp_on_cpu="fp32_dry_run"), device_has_amp=False)
    scaler = cfg.grad_scaler()
    assert scaler.is_enable() and float(scaler._scale) == 1024.0
    layer = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())
    with cfg.autocast():
        loss = layer(paddle.ones([1, 2])).sum()
    scaler.scale(loss).backward()
    assert float(layer.bias.grad) == 1024.0  # d(sum)/d(bias) = 1, scaled
    scaler.unscale_(opt)
    assert float(layer.bias.grad) == 1.0 and not bool(scaler._found_inf)
    state = scaler.state_dict()
    assert float(state["scale"][0]) == 1024.0 and state["use_dynamic_loss_scaling"]


def test_a_scaler_paddle_disabled_is_an_error_not_a_silent_fp32_fallback():
    # device_has_amp=True on this CPU build: Paddle's GradScaler disables itself, and that must not pass silently
    cfg = AmpConfig.for_device(amp_args(fp16=True), device_has_amp=True)
    with pytest.raises(RuntimeError, match="GradScaler came back disabled"):
        cfg.grad_scaler()
