"""hopper-kernels: the GPT-2 configs train with the Hopper keys where every kernel runs, keep any key the config
or the command line sets, say why not on an sm_90 GPU without them, and stop on `on` where they cannot run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptforge.errors import UsageError
from gptforge.model import kernels
from gptforge.train.config import load_config, packaged_configs
from gptforge.train.hopper_keys import apply_hopper_keys

CPU = torch.device("cpu")
FAST = {"attention_backend": "cudnn-flash4", "gelu_epilogue": True, "loss_epilogue": True, "qkv_bias_gemm": True,
        "compile_mode": "reduce-overhead"}


def speed_keys(cfg) -> dict:
    return {attr: getattr(cfg, attr) for attr in FAST}


def test_the_gpt2_configs_ask_for_them_and_a_config_of_ones_own_does_not():
    asks = {name: load_config(name)[0].hopper_kernels for name in packaged_configs()}
    assert asks == {"gpt2-124m": "auto", "gpt2-350m": "auto", "gpt2-774m": "auto", "gpt2-1.5b": "auto", "gpt2-tiny": "off"}


def test_auto_on_an_sm90_with_every_kernel_trains_with_all_of_them(sm90_here):
    cfg, _ = load_config("gpt2-124m")
    resolved, note = apply_hopper_keys(cfg, CPU)
    assert speed_keys(resolved) == FAST
    assert note == "hopper-kernels=auto: " + " ".join(kernels.HOPPER_KEYS)
    assert speed_keys(cfg) != FAST  # the config itself is left as it was


def test_a_key_given_on_the_command_line_wins_even_at_its_default_value(sm90_here):
    cfg, _ = load_config("gpt2-124m", ["attention-backend=auto", "compile-mode=default"])
    resolved, note = apply_hopper_keys(cfg, CPU)
    assert speed_keys(resolved) == {**FAST, "attention_backend": "auto", "compile_mode": "default"}
    assert note.endswith("(kept as given: attention-backend=auto compile-mode=default)")
    assert "attention-backend=cudnn-flash4" not in note and "gelu-epilogue=true" in note


def test_a_key_set_in_the_config_file_wins(sm90_here, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('num-layers = 2\nhidden-size = 64\nnum-attention-heads = 2\nhopper-kernels = "auto"\n'
                    'compile = true\ngelu-epilogue = false\n')
    resolved, note = apply_hopper_keys(load_config(str(path))[0], CPU)
    assert not resolved.gelu_epilogue and resolved.loss_epilogue
    assert "kept as given: gelu-epilogue=false" in note


def test_a_runs_saved_config_read_back_trains_as_saved(sm90_here, tmp_path):
    resolved, _ = apply_hopper_keys(load_config("gpt2-124m", ["compile-mode=default"])[0], CPU)
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(resolved.to_dict()))
    again, note = apply_hopper_keys(load_config(str(saved))[0], CPU)
    assert again == resolved and note.startswith("hopper-kernels=auto: none of its keys (kept as given:")


@pytest.mark.parametrize("attr, value, says", [
    ("FA4_MODULE", "gptforge_no_fa4", "flash-attn-4 is not importable"),
    ("QUACK_MODULE", "gptforge_no_quack", "quack is not importable"),
])
def test_auto_on_an_sm90_without_a_kernel_keeps_the_config_and_says_why(sm90_here, monkeypatch, attr, value, says):
    monkeypatch.setattr(kernels, attr, value)
    cfg, _ = load_config("gpt2-124m")
    resolved, note = apply_hopper_keys(cfg, CPU)
    assert resolved is cfg
    assert note.startswith(f"hopper-kernels=auto: off ({says}") and "pixi run -e hopper" in note


def test_off_changes_nothing_and_says_nothing_on_an_sm90_with_every_kernel(sm90_here):
    cfg, _ = load_config("gpt2-124m", ["hopper-kernels=off"])
    assert apply_hopper_keys(cfg, CPU) == (cfg, None)


@pytest.mark.parametrize("overrides, deepspeed, why", [
    ([], True, "DeepSpeed runs the step without CUDA graphs"),
    (["compile=false"], False, "compile=false"),
])
def test_auto_where_the_step_runs_uncompiled_keeps_the_config_and_says_why(sm90_here, overrides, deepspeed, why):
    cfg, _ = load_config("gpt2-124m", overrides)
    resolved, note = apply_hopper_keys(cfg, CPU, deepspeed=deepspeed)
    assert resolved is cfg
    assert note.startswith(f"hopper-kernels=auto: off ({why}; their kernels pay inside the compiled step's CUDA graphs")


def test_on_under_deepspeed_applies_them_and_says_they_run_eagerly(sm90_here):
    cfg, _ = load_config("gpt2-124m", ["hopper-kernels=on"])
    resolved, note = apply_hopper_keys(cfg, CPU, deepspeed=True)
    assert speed_keys(resolved) == FAST
    assert note == ("hopper-kernels=on: " + " ".join(kernels.HOPPER_KEYS) +
                    "; DeepSpeed runs the step without CUDA graphs: their kernels run eagerly, slower than without them")


def test_auto_on_a_cpu_or_another_gpu_says_nothing():
    cfg, _ = load_config("gpt2-124m")
    assert apply_hopper_keys(cfg, CPU) == (cfg, None)


def test_on_where_they_cannot_run_is_a_usage_error_naming_the_fix():
    cfg, _ = load_config("gpt2-tiny", ["hopper-kernels=on"])
    with pytest.raises(UsageError) as err:
        apply_hopper_keys(cfg, CPU)
    assert err.value.one_line() == ("hopper-kernels: on, but the Hopper kernels cannot run here: needs an sm_90 GPU "
                                    "(hopper-kernels=auto trains without them where they cannot run; `pixi run -e "
                                    "hopper ...` has them)")


def test_a_choice_outside_the_three_is_refused(cli):
    result = cli("train", "--config", "gpt2-tiny", "hopper-kernels=yes", "train-iters=1", "--device", "cpu",
                 "--run-dir", "/nonexistent-never-made")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "hopper-kernels: 'yes' is not one of auto, on, off" in result.stderr + result.stdout


def test_train_with_on_where_they_cannot_run_stops_before_making_the_run_directory(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("train", "--config", "gpt2-tiny", "hopper-kernels=on", "train-iters=2", "--device", "cpu",
                 "--run-dir", str(run_dir))
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in out
    assert "hopper-kernels: on, but the Hopper kernels cannot run here: needs an sm_90 GPU" in out
    assert not run_dir.exists()


def _train_task():
    spec = importlib.util.spec_from_file_location("train_gpt2_task", Path(__file__).parents[1] / "tasks" / "train_gpt2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_gpt2_leaves_the_hopper_keys_to_the_config_and_passes_given_keys_last(sm90_here):
    args = _train_task().arguments(["attention-backend=auto"], gpu=True)
    assert args[:3] == ["train", "--config", "gpt2-124m"] and args[-1] == "attention-backend=auto"
    assert not set(kernels.HOPPER_KEYS) & set(args)
    resolved, _ = apply_hopper_keys(load_config("gpt2-124m", args[3:])[0], CPU)
    assert resolved.attention_backend == "auto" and resolved.gelu_epilogue and resolved.compile_mode == "reduce-overhead"


def test_train_gpt2_without_a_gpu_trains_the_tiny_config(capsys):
    assert _train_task().arguments(["train-iters=3"], gpu=False) == ["train", "--config", "gpt2-tiny", "train-iters=3"]
    assert "no usable GPU here" in capsys.readouterr().out


sm90_with_the_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() or kernels.hopper_keys_blocker(torch.device("cuda")) is not None,
    reason="needs an sm_90 GPU with flash-attn-4, quack-kernels and the CuTe DSL (the hopper environment)")


@pytest.mark.gpu
@sm90_with_the_kernels
def test_on_an_h100_the_gpt2_config_trains_with_every_hopper_key_and_saves_them(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "gptforge", "train", "--config", "gpt2-124m", "--device", "cuda", "--json",
           "--run-dir", str(run_dir), "num-layers=2", "micro-batch-size=8", "global-batch-size=16", "train-iters=30",
           "eval-interval=30", "save-interval=30", f"data-cache-dir={tmp_path / 'data'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert "hopper-kernels=auto: " + " ".join(kernels.HOPPER_KEYS) in result["notes"]
    assert not any("asked for but" in note for note in result["notes"])
    assert result["final_val_loss"] < result["first_val_loss"] - 0.5
    saved = json.loads((run_dir / "config.json").read_text())
    assert {key: saved[key] for key in ("attention-backend", "gelu-epilogue", "loss-epilogue", "bf16-weights", "compile-mode")} == \
        {"attention-backend": "cudnn-flash4", "gelu-epilogue": True, "loss-epilogue": True, "bf16-weights": True,
         "compile-mode": "reduce-overhead"}
    assert any("float32 master weights" in note for note in result["notes"])  # bf16-weights, with accumulation


def test_the_trainer_under_deepspeed_leaves_the_gpt2_config_as_it_is(sm90_here, tmp_path, monkeypatch):
    from gptforge.train import loop

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(loop.importlib.util, "find_spec",
                        lambda name, *args: object() if name == "deepspeed" else real_find_spec(name, *args))
    cfg, _ = load_config("gpt2-124m", [f"data-cache-dir={tmp_path / 'data'}"])
    trainer = loop.Trainer(cfg, loop.RunOptions(run_dir=tmp_path / "run", device="cpu", deepspeed="zero2"))
    trainer.preflight()
    assert speed_keys(trainer.cfg) == speed_keys(cfg)
    assert any(note.startswith("hopper-kernels=auto: off (DeepSpeed runs the step without CUDA graphs") for note in trainer.notes)
