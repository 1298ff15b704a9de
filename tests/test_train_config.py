"""Training config: packaged TOML files, key=value overrides, unknown keys, validation rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, strategies as st

from gptforge.errors import UsageError
from gptforge.train.config import KNOWN_KEYS, TrainConfig, list_keys, load_config, packaged_configs, validate
from gptforge.train.optim import lr_at


def test_every_packaged_config_loads_and_validates():
    assert set(packaged_configs()) == {"gpt2-tiny", "gpt2-124m", "gpt2-124m-hopper", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"}
    for name in packaged_configs():
        cfg, _ = load_config(name)
        validate(cfg, world_size=1)
        validate(cfg, world_size=8) if name != "gpt2-tiny" else None


def test_overrides_are_typed():
    cfg, _ = load_config("gpt2-tiny", ["lr=1e-3", "train-iters=7", "compile=true", "data-path=a b",
                                       "precision=bf16", "optim.min-lr=1e-5", "adam-beta2=1"])
    assert (cfg.lr, cfg.train_iters, cfg.compile, cfg.data_path, cfg.precision) == (1e-3, 7, True, ["a", "b"], "bf16")
    assert cfg.min_lr == 1e-5 and cfg.adam_beta2 == 1.0 and isinstance(cfg.adam_beta2, float)


@pytest.mark.parametrize("override,message", [
    ("hiden-size=64", "unknown config key 'hiden-size'"),
    ("lr=fast", "lr must be float"),
    ("train-iters=1.5", "train-iters must be int"),
    ("compile=1", "compile must be bool"),
    ("noequals", "is not key=value"),
    ("data-path=[1,2]", "data-path item 2 is not a path"),
    ("data-path=[0.5, 1]", "data-path item 1 is not a path"),
    ("data-path=[true]", "data-path item True is not a path"),
])
def test_bad_overrides(override, message):
    with pytest.raises(UsageError, match=message):
        load_config("gpt2-tiny", [override])


def test_unknown_key_in_a_file_is_an_error(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[model]\nnum-layers = 2\nnum-layer = 3\n")
    with pytest.raises(UsageError) as err:
        load_config(str(path))
    assert "unknown config key 'num-layer'" in err.value.one_line()
    assert "did you mean 'num-layers'" in err.value.one_line()


@pytest.mark.parametrize("overrides,world,flag", [
    (["global-batch-size=24", "micro-batch-size=16"], 1, "global-batch-size"),
    (["global-batch-size=32", "micro-batch-size=16"], 3, "global-batch-size"),
    (["seq-length=65"], 1, "seq-length"),
    (["hidden-size=130"], 1, "hidden-size"),
    (["precision=fp8"], 1, "precision"),
    (["accel=fp8"], 1, "accel"),
    (["split=90,x"], 1, "split"),
    (["min-lr=1"], 1, "min-lr"),
    (["lr-warmup-iters=300"], 1, "lr-warmup-iters"),
    (["lr=0"], 1, "lr"),
    (["min-lr=-1e-4"], 1, "min-lr"),
    (["lr-warmup-iters=-3"], 1, "lr-warmup-iters"),
    (["lr-decay-iters=-3"], 1, "lr-decay-iters"),
    (["weight-decay=-0.1"], 1, "weight-decay"),
    (["clip-grad=-1"], 1, "clip-grad"),
    (["eval-iters=0"], 1, "eval-iters"),
    (["adam-beta1=1.5"], 1, "adam-beta1"),
    (["adam-beta2=-0.1"], 1, "adam-beta2"),
    (["data-path=a b c d"], 1, "data-path"),
    (["data-path=-1 b 2 d"], 1, "data-path"),
    (["data-path=0.5 b c"], 1, "data-path"),
    (["tokenizer-type=sentencepiece"], 1, "tokenizer-type"),
    # not finite: each used to pass here and fail later (a traceback, no clipping, a NaN loss)
    (["lr=nan"], 1, "lr"),
    (["adam-beta1=nan"], 1, "adam-beta1"),
    (["clip-grad=nan"], 1, "clip-grad"),
    (["min-lr=nan"], 1, "min-lr"),
    (["weight-decay=nan"], 1, "weight-decay"),
    (["lr=inf"], 1, "lr"),
    (["dropout=nan"], 1, "dropout"),
    (["seed=-1"], 1, "seed"),
    (["seed=4294967296"], 1, "seed"),
    (["split=0,1,0"], 1, "split"),
    (["split=949,0,1"], 1, "split"),
    (["split=nan,1,1"], 1, "split"),
    (["split=inf,1,1"], 1, "split"),
    (["data-path=nan a 1 b"], 1, "data-path"),
    (["data-path=inf a 1 b"], 1, "data-path"),
    # the embedded corpus has its own tokenizer: these would be silently ignored
    (["tokenizer-dir=tok"], 1, "tokenizer-dir"),
    (["vocab-file=v.json", "merge-file=m.txt"], 1, "vocab-file"),
    (["tokenizer-type=gpt2"], 1, "tokenizer-type"),
])
def test_validation_names_the_key(overrides, world, flag):
    cfg, _ = load_config("gpt2-tiny", overrides)
    with pytest.raises(UsageError) as err:
        validate(cfg, world)
    assert err.value.flag == flag


def test_seed_bounds_are_accepted():
    for seed in (0, 2**32 - 1):
        cfg, _ = load_config("gpt2-tiny", [f"seed={seed}"])
        validate(cfg)


def test_a_key_in_two_tables_is_an_error(tmp_path):
    path = tmp_path / "dup.toml"
    path.write_text("[model]\nnum-layers = 2\nhidden-size = 64\nnum-attention-heads = 2\nlr = 1e-3\n[optim]\nlr = 2e-3\n")
    with pytest.raises(UsageError, match=r"key 'lr' is set in \[model\] and in \[optim\]") as err:
        load_config(str(path))
    assert err.value.flag == "--config"


def test_a_config_file_without_model_keys_is_an_error(tmp_path):
    """Not a silent 92M-parameter default model (which a CPU trains for hours)."""
    path = tmp_path / "nomodel.toml"
    path.write_text("train-iters = 2\n")
    with pytest.raises(UsageError, match="does not say which model to train .no num-layers, hidden-size, num-attention-heads"):
        load_config(str(path))


@pytest.mark.parametrize("content", [b"lr = \n[model\n", b"\xff\xfe\x00lr = 1"])
def test_unreadable_config_file_is_a_usage_error(tmp_path, content):
    path = tmp_path / "broken.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError, match="broken.toml: (malformed TOML|not UTF-8)") as err:
        load_config(str(path))
    assert err.value.flag == "--config"


def test_resolved_config_round_trips(tmp_path):
    cfg, _ = load_config("gpt2-124m", ["data-path=0.3 a 0.7 b", 'tokenizer-dir=we"ird'])
    path = tmp_path / "config.json"  # as a run saves it
    path.write_text(json.dumps(cfg.to_dict(), indent=2))
    again, _ = load_config(str(path))
    assert again == cfg


@given(step=st.integers(0, 5000), warmup=st.integers(0, 500), iters=st.integers(1, 5000))
def test_schedule_stays_between_min_and_max(step, warmup, iters):
    assume(warmup < iters)
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, lr_warmup_iters=warmup, train_iters=iters)
    lr = lr_at(step, cfg)
    assert 0 < lr <= cfg.lr
    if step >= warmup:
        assert lr >= cfg.min_lr - 1e-12
    if step >= iters:
        assert lr == cfg.min_lr


def test_warmup_then_cosine_shape():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, lr_warmup_iters=10, train_iters=110)
    assert lr_at(0, cfg) < lr_at(5, cfg) < lr_at(9, cfg) <= 1.0
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_list_keys_covers_every_field():
    assert set(KNOWN_KEYS) == {k.replace("_", "-") for k in TrainConfig.__dataclass_fields__}


def test_deepspeed_config_is_completed_from_the_run(tmp_path):
    from gptforge.train.deepspeed_engine import read_deepspeed_config

    cfg, _ = load_config("gpt2-124m")
    ds = read_deepspeed_config("zero2", cfg, world_size=2)  # a packaged config, by name
    assert ds["zero_optimization"]["stage"] == 2 and ds["bf16"]["enabled"]
    assert ds["timers"] == {"throughput": {"enabled": False}}  # DeepSpeed's timer waits for the device every micro batch
    own = tmp_path / "timed.json"
    own.write_text('{"timers": {"throughput": {"enabled": true}}}')
    assert read_deepspeed_config(str(own), cfg, world_size=2)["timers"]["throughput"]["enabled"]  # the user's choice kept
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (16, 16, 512)
    both = tmp_path / "both.json"
    both.write_text('{"bf16": {"enabled": true}, "fp16": {"enabled": true}}')
    with pytest.raises(UsageError, match="both bf16 and fp16"):
        read_deepspeed_config(str(both), cfg, world_size=1)
    for stage in ("zero1", "zero3", "zero2-fp16"):
        assert read_deepspeed_config(stage, cfg, 1)["gradient_clipping"] == 1.0


def installed_deepspeed(site, version: str) -> None:
    """A DeepSpeed distribution of VERSION as pip installs its metadata, under the directory SITE."""
    info = site / f"deepspeed-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version}\n")


def test_a_deepspeed_too_old_for_the_packaged_config_is_one_line(monkeypatch, tmp_path):
    from gptforge.train.deepspeed_engine import read_deepspeed_config

    cfg, _ = load_config("gpt2-124m")
    installed_deepspeed(tmp_path / "old", "0.17.0")
    monkeypatch.syspath_prepend(str(tmp_path / "old"))
    with pytest.raises(UsageError, match="since 0.17.1"):
        read_deepspeed_config("zero2", cfg, world_size=2)
    installed_deepspeed(tmp_path / "new", "0.17.1")
    monkeypatch.syspath_prepend(str(tmp_path / "new"))
    assert read_deepspeed_config("zero2", cfg, world_size=2)["bf16"]["check_grad_overflow"] is False


def test_deepcompile_says_why_it_cannot_run(monkeypatch):
    import torch

    from gptforge.train.deepspeed_engine import deepcompile_unavailable

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA device" in deepcompile_unavailable()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: (_ for _ in ()).throw(ModuleNotFoundError(name)))
    assert "not installed" in deepcompile_unavailable()
    assert "resume" in deepcompile_unavailable(resuming=True)
    assert "eval-interval" in deepcompile_unavailable(zero3_evaluates_midrun=True)


@pytest.mark.parametrize("arch_list, fixed", [("9.0", None), ("8.0;9.0", None), ("8.0 9.0+PTX", None), ("", None),
                                              ("9.0a", "9.0"), ("8.0;9.0a", "8.0;9.0"), ("10.0f 12.0", "10.0;12.0")])
def test_deepcompile_is_off_where_deepspeed_cannot_read_the_arch_list(monkeypatch, arch_list, fixed):
    import torch
    from torch.utils import cpp_extension

    from gptforge.train.deepspeed_engine import deepcompile_unavailable

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    why = deepcompile_unavailable()
    assert why is None if fixed is None else why.endswith(f"set TORCH_CUDA_ARCH_LIST={fixed} for this run to build its op")


@pytest.mark.parametrize("name", packaged_configs())
def test_short_runs_of_every_packaged_config_are_valid(name):
    """`gptforge train train-iters=10`: the warmup scales with the run instead of outlasting it."""
    cfg, _ = load_config(name, ["train-iters=10"])
    validate(cfg)
    assert 0 < cfg.warmup_iters() < 10
    full, _ = load_config(name)
    assert full.warmup_iters() == (20 if name == "gpt2-tiny" else 700)  # the published schedules are unchanged


def test_list_keys_shows_the_chosen_config_with_one_line_per_key():
    cfg, _ = load_config("gpt2-124m", ["train-iters=10"])
    lines = list_keys(cfg).splitlines()
    assert len(lines) == len(KNOWN_KEYS)
    by_key = {line.split(" = ")[0]: line for line in lines}
    assert by_key["hidden-size"].split("#")[0].split("=")[1].strip() == "768"
    assert by_key["train-iters"].split("#")[0].split("=")[1].strip() == "10"
    assert all(line.split("#", 1)[1].strip() for line in lines)  # a description on every line


def test_every_key_has_one_default_of_its_type_and_a_help_line():
    from gptforge.train.config import TYPES

    for key, kind in TYPES.items():
        default = KNOWN_KEYS[key].default_factory() if kind is list else KNOWN_KEYS[key].default
        assert type(default) is kind and KNOWN_KEYS[key].metadata["help"], key


def test_a_config_toml_of_an_older_run_still_loads(tmp_path):
    """Runs used to save RUN/config.toml: a header comment, then every key flat."""
    cfg, _ = load_config("gpt2-tiny", ["data-path=0.3 a 0.7 b"])
    lines = ["# resolved config of this run (from gpt2-tiny); rerun with --config this-file"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in cfg.to_dict().items()]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    assert load_config(str(path))[0] == cfg


def test_config_keys_stay_few():
    assert len(KNOWN_KEYS) <= 35, f"{len(KNOWN_KEYS)} config keys: fold or remove one before adding another"
