"""Training configuration: packaged TOML files with Megatron-style keys, plus ``key=value`` overrides.

A TOML file may group keys under tables ([model], [optim], ...) for reading; the tables are flattened,
every key is unique, and an unknown key anywhere is an error. Overrides use the same hyphenated names.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from gptforge.errors import UsageError
from gptforge.model.config import ModelConfig

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
TOKENIZERS = ("default", "gpt2", "bytelevel")


@dataclass
class TrainConfig:
    # model
    num_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    seq_length: int = 1024
    max_position_embeddings: int = 1024
    dropout: float = 0.0
    # optimizer and schedule
    lr: float = 6e-4
    min_lr: float = 6e-5
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float = 0.0  # used when lr-warmup-iters is 0
    lr_decay_iters: int = 0  # 0: decay over train-iters
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    # batch and length
    micro_batch_size: int = 8
    global_batch_size: int = 64
    train_iters: int = 1000
    seed: int = 1234
    # evaluation, checkpoints, logs
    eval_interval: int = 100
    eval_iters: int = 10
    save_interval: int = 500
    keep_last: int = 2
    log_interval: int = 10
    # data
    data_path: list = field(default_factory=list)  # Megatron style: ["PREFIX"] or ["W1", "P1", "W2", "P2"]
    split: str = "949,50,1"
    tokenizer_type: str = "default"  # default: the embedded corpus' byte-level BPE
    tokenizer_dir: str = ""
    vocab_file: str = ""
    merge_file: str = ""
    default_vocab_size: int = 8192
    data_cache_dir: str = ".gptforge/data"
    # precision and accelerators (each used only when installed AND asked for)
    precision: str = "auto"  # auto: bf16 on GPUs that have it, else fp16 + loss scaling; fp32 on CPU
    tf32: bool = True
    compile: bool = False
    compile_mode: str = "default"  # default | max-autotune-no-cudagraphs | reduce-overhead | max-autotune
    attention_backend: str = "auto"  # auto | flash | cudnn | efficient | math (pins SDPA's kernel)
    fused_loss: bool = False  # output layer + cross-entropy in chunks, no full logits tensor
    loss_chunk_tokens: int = 8192
    fused_adamw: bool = True  # torch AdamW's fused CUDA kernel (foreach when false or on CPU)
    apex_fused_adam: bool = False
    apex_layernorm: bool = False
    transformer_engine: bool = False
    fp8: bool = False
    fp8_recipe: str = "delayed"  # delayed | current (TransformerEngine scaling recipe)

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=vocab_size,
            dropout=self.dropout,
        )

    def warmup_iters(self) -> int:
        return self.lr_warmup_iters or int(round(self.lr_warmup_fraction * self.decay_iters()))

    def decay_iters(self) -> int:
        return self.lr_decay_iters or self.train_iters

    def to_dict(self) -> dict:
        return {key_name(f.name): getattr(self, f.name) for f in fields(self)}


def key_name(attr: str) -> str:
    return attr.replace("_", "-")


def attr_name(key: str) -> str:
    return key.replace("-", "_")


KNOWN_KEYS = {key_name(f.name): f for f in fields(TrainConfig)}


def packaged_configs() -> list[str]:
    folder = resources.files("gptforge") / "configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.startswith("gpt2-") and p.name.endswith(".toml"))


def resolve_config_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        return path
    packaged = resources.files("gptforge") / "configs" / f"{name_or_path}.toml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UsageError("--config", f"no config file or packaged config named {name_or_path!r}",
                     f"use one of {', '.join(packaged_configs())} or a path to a .toml file")


def flatten(table: dict, source: str, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flatten(value, source, f"{prefix}{key}."))
        elif key in flat:
            raise UsageError(None, f"{source}: key {key!r} appears twice", "keep one")
        else:
            flat[key] = value
    return flat


def coerce(key: str, value, source: str):
    expected = KNOWN_KEYS[key].type
    expected = {"int": int, "float": float, "bool": bool, "str": str, "list": list}.get(expected, expected)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is list and isinstance(value, str):
        return value.split()
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise UsageError(source, f"{key} must be {expected.__name__}, got {value!r}", f"e.g. {key}={default_text(key)}")
    return value


def default_text(key: str) -> str:
    f = KNOWN_KEYS[key]
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return str(default).lower() if isinstance(default, bool) else repr(default) if isinstance(default, (str, list)) else str(default)


def check_known(key: str, source: str) -> None:
    if key not in KNOWN_KEYS:
        import difflib

        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see 'gptforge train --list-keys'"
        raise UsageError(source, f"unknown config key {key!r}", hint)


def parse_override(text: str):
    if "=" not in text:
        raise UsageError("override", f"{text!r} is not key=value", "e.g. lr=3e-4 train-iters=200")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    key = key.rsplit(".", 1)[-1]  # accept "optim.lr" as "lr"
    check_known(key, "override")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare strings need no quotes: data-path=my/prefix precision=bf16
    if KNOWN_KEYS[key].type == "str" and not isinstance(value, str):
        value = raw
    return key, coerce(key, value, "override")


def load_config(name_or_path: str, overrides: list[str] = ()) -> tuple[TrainConfig, Path]:
    path = resolve_config_path(name_or_path)
    try:
        table = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UsageError("--config", f"{path.name} is not valid TOML: {err}", "fix the file") from None
    except OSError as err:
        raise UsageError("--config", f"cannot read {path}: {err.strerror}", "give a readable .toml file") from None
    values = {}
    for key, value in flatten(table, path.name).items():
        check_known(key, path.name)
        values[key] = coerce(key, value, path.name)
    for text in overrides:
        key, value = parse_override(text)
        values[key] = value
    cfg = TrainConfig(**{attr_name(k): v for k, v in values.items()})
    return cfg, path


def validate(cfg: TrainConfig, world_size: int = 1) -> None:
    """Every check that needs no GPU and no data; raises UsageError naming the key and the fix."""
    positive = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
                "micro_batch_size", "global_batch_size", "train_iters", "eval_interval", "save_interval",
                "eval_iters", "keep_last", "log_interval", "default_vocab_size", "lr")
    for attr in positive:
        if getattr(cfg, attr) <= 0:
            raise UsageError(key_name(attr), f"must be positive, got {getattr(cfg, attr)}", "set a value > 0")
    non_negative = ("min_lr", "lr_warmup_iters", "lr_decay_iters", "weight_decay", "adam_eps", "clip_grad")
    for attr in non_negative:
        if getattr(cfg, attr) < 0:
            raise UsageError(key_name(attr), f"must be >= 0, got {getattr(cfg, attr)}", "set a value >= 0")
    for attr in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, attr) < 1.0:
            raise UsageError(key_name(attr), f"{getattr(cfg, attr)} is outside [0, 1)", "e.g. adam-beta1=0.9 adam-beta2=0.95")
    if cfg.hidden_size % cfg.num_attention_heads:
        raise UsageError("hidden-size", f"{cfg.hidden_size} is not divisible by num-attention-heads={cfg.num_attention_heads}",
                         "pick a head count that divides the width")
    if cfg.seq_length > cfg.max_position_embeddings:
        raise UsageError("seq-length", f"{cfg.seq_length} is longer than the position table "
                         f"(max-position-embeddings={cfg.max_position_embeddings})",
                         f"set seq-length<={cfg.max_position_embeddings} or raise max-position-embeddings")
    per_step = cfg.micro_batch_size * world_size
    if cfg.global_batch_size % per_step:
        raise UsageError("global-batch-size", f"{cfg.global_batch_size} is not divisible by micro-batch-size "
                         f"({cfg.micro_batch_size}) x data-parallel size ({world_size}) = {per_step}",
                         f"use a multiple of {per_step}")
    if cfg.precision not in PRECISIONS:
        raise UsageError("precision", f"{cfg.precision!r} is not one of {', '.join(PRECISIONS)}", "precision=auto")
    if not 0.0 <= cfg.lr_warmup_fraction < 1.0:
        raise UsageError("lr-warmup-fraction", f"{cfg.lr_warmup_fraction} is outside [0, 1)", "e.g. 0.01")
    if cfg.min_lr > cfg.lr:
        raise UsageError("min-lr", f"{cfg.min_lr} is above lr={cfg.lr}", "set min-lr <= lr")
    if cfg.warmup_iters() >= cfg.decay_iters():
        raise UsageError("lr-warmup-iters", f"warmup ({cfg.warmup_iters()} steps) does not end before the decay does "
                         f"({cfg.decay_iters()})", "shorten the warmup or train longer")
    if not 0.0 <= cfg.dropout < 1.0:
        raise UsageError("dropout", f"{cfg.dropout} is outside [0, 1)", "e.g. 0.0")
    validate_split(cfg.split)
    validate_data_path(cfg.data_path)
    validate_speed_keys(cfg)
    if cfg.tokenizer_type not in TOKENIZERS:
        raise UsageError("tokenizer-type", f"{cfg.tokenizer_type!r} is not one of {', '.join(TOKENIZERS)}",
                         "the tokenizer the data was prepared with, e.g. tokenizer-type=gpt2")


def validate_data_path(data_path: list) -> None:
    """One prefix, or a blend: pairs of WEIGHT PREFIX with numeric, non-negative weights."""
    if len(data_path) <= 1:
        return
    fix = "e.g. data-path='0.7 a_text 0.3 b_text'"
    if len(data_path) % 2:
        raise UsageError("data-path", "a blend is pairs of WEIGHT PREFIX", fix)
    for weight in data_path[0::2]:
        try:
            if float(weight) < 0:
                raise ValueError
        except ValueError:
            raise UsageError("data-path", f"blend weight {weight!r} is not a non-negative number", fix) from None


def validate_split(split: str) -> None:
    parts = split.replace("/", ",").split(",")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise UsageError("split", f"{split!r} is not comma-separated numbers", "e.g. split=949,50,1") from None
    if len(numbers) > 3 or any(n < 0 for n in numbers) or sum(numbers) <= 0:
        raise UsageError("split", f"{split!r} needs up to three non-negative weights", "e.g. split=949,50,1")


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
FP8_RECIPES = ("delayed", "current")


def validate_speed_keys(cfg: TrainConfig) -> None:
    """The throughput levers: each names one of a fixed set of choices."""
    from gptforge.model.layers import ATTENTION_BACKENDS

    choices = {"compile-mode": COMPILE_MODES, "attention-backend": tuple(ATTENTION_BACKENDS), "fp8-recipe": FP8_RECIPES}
    for key, allowed in choices.items():
        value = getattr(cfg, attr_name(key))
        if value not in allowed:
            raise UsageError(key, f"{value!r} is not one of {', '.join(allowed)}", f"e.g. {key}={allowed[0]}")
    if cfg.loss_chunk_tokens <= 0:
        raise UsageError("loss-chunk-tokens", f"must be positive, got {cfg.loss_chunk_tokens}", "e.g. loss-chunk-tokens=8192")
