"""Training configuration: flat TOML presets with Megatron-style keys, plus ``key=value`` overrides.

``TrainConfig`` holds every key: its type (the annotation), its default and its help line. A file may
still group keys under tables ([model], [optim], ...) for reading: every key is unique, and an unknown
key anywhere is an error. A run saves its resolved config as JSON, which
``--config`` reads back.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path

from gptforge.core.dataspec import TOKENIZER_KINDS, split_weights
from gptforge.errors import FileReadError, UsageError
from gptforge.model.config import ModelConfig
from gptforge.reading import read_json, read_toml

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
ACCEL_CHOICES = ("none", "triton", "hopper", "te-fp8")  # gptforge.accel's sets of kernels
MODEL_KEYS = ("num-layers", "hidden-size", "num-attention-heads")  # a config file must say which model
SEED_LIMIT = 2**32  # numpy's RandomState (the dataset shuffles) takes seeds in [0, 2**32)
CONFIG_BYTES = 1 << 20  # a config file is a screenful of keys
TOKENIZERS = ("default", *TOKENIZER_KINDS)  # default: the embedded corpus, which brings its own


def key_name(attr: str) -> str:
    return attr.replace("_", "-")


def attr_name(key: str) -> str:
    return key.replace("-", "_")


def check_value(key: str, value, kind: type, source: str):
    """``value`` (read from a file or an override) as the ``kind`` the key needs, or a UsageError naming both."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is list and isinstance(value, (str, list)):
        return coerce_path_list(key, value, source)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise UsageError(source, f"{key} must be {kind.__name__}, got {value!r}", f"e.g. {key}={default_text(key)}")
    return value


def value_text(value) -> str:
    """A value as a TOML/JSON literal (floats as Python writes them, so nan and inf stay readable)."""
    return repr(value) if isinstance(value, float) else json.dumps(value)


def coerce_path_list(key: str, value, source: str) -> list[str]:
    """``data-path``: one prefix, or WEIGHT PREFIX pairs; numbers only where a weight goes."""
    items = value.split() if isinstance(value, str) else value
    blend = len(items) > 1
    out = []
    for i, item in enumerate(items):
        weight_slot = blend and i % 2 == 0
        is_number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if not (isinstance(item, str) or (weight_slot and is_number)):
            raise UsageError(source, f"{key} item {item!r} is not a {'weight or a ' if weight_slot else ''}path",
                             "e.g. data-path=my_text_document or data-path='0.7 a_text 0.3 b_text'")
        out.append(str(item))
    return out


def key_field(default, help: str):
    """A config key's default and the line `gptforge train --list-keys` prints for it; its type is the annotation."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # model
    num_layers: int = key_field(12, "transformer blocks")
    hidden_size: int = key_field(768, "model width")
    num_attention_heads: int = key_field(12, "attention heads (must divide hidden-size)")
    seq_length: int = key_field(1024, "tokens per training sample")
    max_position_embeddings: int = key_field(1024, "size of the position table (>= seq-length)")
    dropout: float = key_field(0.0, "dropout probability (0: none)")
    # optimizer and schedule
    lr: float = key_field(6e-4, "peak learning rate")
    min_lr: float = key_field(6e-5, "learning rate at the end of the cosine decay")
    lr_warmup_iters: int = key_field(0, "linear warmup steps (0: use lr-warmup-fraction)")
    lr_warmup_fraction: float = key_field(0.0, "warmup as a fraction of the decay steps, used when lr-warmup-iters is 0")
    lr_decay_iters: int = key_field(0, "cosine decay steps (0: train-iters)")
    weight_decay: float = key_field(0.1, "AdamW weight decay (not on biases and norms)")
    adam_beta1: float = key_field(0.9, "AdamW beta1")
    adam_beta2: float = key_field(0.95, "AdamW beta2")
    clip_grad: float = key_field(1.0, "gradient-norm clipping (0: none)")
    # batch and length
    micro_batch_size: int = key_field(8, "samples per forward/backward on one device")
    global_batch_size: int = key_field(64, "samples per optimizer step (micro x accumulation x data-parallel)")
    train_iters: int = key_field(1000, "optimizer steps of the run")
    seed: int = key_field(1234, "random seed (weights, data order, dropout)")
    # evaluation, checkpoints, logs
    eval_interval: int = key_field(100, "steps between validation losses (and one at the end)")
    eval_iters: int = key_field(10, "global batches per validation loss")
    save_interval: int = key_field(500, "steps between checkpoints (and one at the end)")
    keep_last: int = key_field(2, "checkpoints kept")
    log_interval: int = key_field(10, "steps between log lines")
    # data
    data_path: list = key_field([], "Megatron style: PREFIX, or a blend 'W1 P1 W2 P2' (empty: the embedded corpus)")
    split: str = key_field("949,50,1", "train,valid,test weights")
    tokenizer_type: str = key_field("default", "tokenizer the data was prepared with: default (embedded corpus), gpt2, "
                                               "bytelevel")
    tokenizer_dir: str = key_field("", "directory with vocab.json + merges.txt")
    vocab_file: str = key_field("", "GPT-2 style vocab.json")
    merge_file: str = key_field("", "GPT-2 style merges.txt")
    default_vocab_size: int = key_field(8192, "vocabulary of the byte-level BPE trained on the embedded corpus")
    data_cache_dir: str = key_field(".gptforge/data", "where the embedded corpus and sample indices are cached")
    # precision and speed
    precision: str = key_field("auto", "auto (bf16 on GPUs that have it, else fp16 + loss scaling; fp32 on CPU), bf16, "
                                       "fp16, fp32")
    compile: bool = key_field(False, "torch.compile the model")
    accel: str = key_field("triton", "the speed package's kernels: none (torch ops throughout), triton (the "
                                     "project's Triton cross-entropy kernel, on CUDA), hopper (triton's and, on an "
                                     "sm_90 GPU with the hopper environment's packages, cuDNN + FlashAttention 4 "
                                     "attention, quack's GEMM epilogues, CUDA graphs; the *-hopper configs set it), "
                                     "te-fp8 (triton's and TransformerEngine's layers in FP8, sm_89+)")

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
        """lr-warmup-iters, else the fraction of the decay: at least one step, and ending before the decay."""
        if self.lr_warmup_iters or not self.lr_warmup_fraction:
            return self.lr_warmup_iters
        return min(max(1, round(self.lr_warmup_fraction * self.decay_iters())), self.decay_iters() - 1)

    def decay_iters(self) -> int:
        return self.lr_decay_iters or self.train_iters

    def to_dict(self) -> dict:
        return {key_name(f.name): getattr(self, f.name) for f in fields(self)}


KNOWN_KEYS = {key_name(f.name): f for f in fields(TrainConfig)}


def default_text(key: str) -> str:
    f = KNOWN_KEYS[key]
    default = f.default_factory() if f.default is MISSING else f.default
    if isinstance(default, bool):
        return str(default).lower()
    return repr(default) if isinstance(default, (str, list)) else str(default)
TYPES = {key_name(attr): kind for attr, kind in typing.get_type_hints(TrainConfig).items()}


def packaged_configs() -> list[str]:
    folder = resources.files("gptforge") / "configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.startswith("gpt2-") and p.name.endswith(".toml"))


def resolve_config_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".toml", ".json") and path.is_file():
        return path
    packaged = resources.files("gptforge") / "configs" / f"{name_or_path}.toml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UsageError("--config", f"no config file or packaged config named {name_or_path!r}",
                     f"use one of {', '.join(packaged_configs())} or a path to a .toml file")


def flatten(table: dict, source: str) -> dict:
    """Keys of every table in one namespace; a key set in two tables is an error, not "the last wins"."""
    flat: dict = {}
    where: dict = {}
    for key, value, table_name in _leaves(table):
        if key in flat:
            raise UsageError("--config", f"{source}: key {key!r} is set in [{where[key] or 'top level'}] and in "
                             f"[{table_name or 'top level'}]", "keep one of them")
        flat[key], where[key] = value, table_name
    return flat


def _leaves(table: dict, name: str = ""):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{name}.{key}" if name else key)
        else:
            yield key, value, name


def list_keys(cfg: TrainConfig) -> str:
    """Every key with its value in ``cfg`` and its description, one line each, as TOML."""
    lines = [f"{key_name(f.name)} = {value_text(getattr(cfg, f.name))}" for f in fields(cfg)]
    width = max(map(len, lines))
    return "\n".join(f"{line:<{width}}  # {f.metadata['help']}" for line, f in zip(lines, fields(cfg)))


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
    return key, check_value(key, override_value(raw, TYPES[key]), TYPES[key], "override")


TEXT_KINDS = {str: str, list: (str, list)}  # kinds a bare word on the command line already is


def override_value(raw: str, kind: type):
    """A command-line value: JSON for numbers, true/false, arrays and quoted strings, and nan or inf for a
    float; anything else is the text itself (bare strings need no quotes: data-path=my/prefix precision=bf16)."""
    try:
        value = float(raw) if kind is float else json.loads(raw)
    except (ValueError, RecursionError):
        return raw  # a bare word; where the key needs another kind, check_value says so
    return raw if kind in TEXT_KINDS and not isinstance(value, TEXT_KINDS[kind]) else value


def read_config_file(path: Path) -> dict:
    """The keys of a TOML config, or of a run's resolved config (JSON)."""
    try:
        if path.suffix == ".json":
            return read_json(path, max_bytes=CONFIG_BYTES, expect=dict, fix="fix the file")
        return flatten(read_toml(path, max_bytes=CONFIG_BYTES, fix="fix the file"), path.name)
    except FileReadError as err:
        raise UsageError("--config", err.message, err.fix) from None


def load_config(name_or_path: str, overrides: list[str] = ()) -> tuple[TrainConfig, Path]:
    path = resolve_config_path(name_or_path)
    values = {}
    flat = read_config_file(path)
    for key, value in flat.items():
        check_known(key, path.name)
        values[key] = check_value(key, value, TYPES[key], path.name)
    missing = [key for key in MODEL_KEYS if key not in flat]
    if missing:
        raise UsageError("--config", f"{path.name} does not say which model to train (no {', '.join(missing)})",
                         "set them under [model], or start from a packaged config: --config gpt2-tiny KEY=VALUE")
    for text in overrides:
        key, value = parse_override(text)
        values[key] = value
    return TrainConfig(**{attr_name(k): v for k, v in values.items()}), path


def validate(cfg: TrainConfig, world_size: int = 1) -> None:
    """Every check that needs no GPU and no data; raises UsageError naming the key and the fix."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if TYPES[key_name(f.name)] is float and not math.isfinite(value):
            raise UsageError(key_name(f.name), f"must be a finite number, got {value}", f"e.g. {key_name(f.name)}={default_text(key_name(f.name))}")
    check_seed(cfg.seed, "seed")
    positive = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
                "micro_batch_size", "global_batch_size", "train_iters", "eval_interval", "save_interval",
                "eval_iters", "keep_last", "log_interval", "default_vocab_size", "lr")
    for attr in positive:
        if getattr(cfg, attr) <= 0:
            raise UsageError(key_name(attr), f"must be positive, got {getattr(cfg, attr)}", "set a value > 0")
    non_negative = ("min_lr", "lr_warmup_iters", "lr_decay_iters", "weight_decay", "clip_grad")
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
    if cfg.accel not in ACCEL_CHOICES:
        raise UsageError("accel", f"{cfg.accel!r} is not one of {', '.join(ACCEL_CHOICES)}", "e.g. accel=triton")
    if cfg.tokenizer_type not in TOKENIZERS:
        raise UsageError("tokenizer-type", f"{cfg.tokenizer_type!r} is not one of {', '.join(TOKENIZERS)}",
                         "the tokenizer the data was prepared with, e.g. tokenizer-type=gpt2")
    check_tokenizer_keys(cfg)


def check_seed(seed: int, flag: str) -> None:
    if not 0 <= seed < SEED_LIMIT:
        raise UsageError(flag, f"{seed} is outside [0, 2**32)", "e.g. 1234")


def check_tokenizer_keys(cfg: TrainConfig) -> None:
    """The embedded corpus brings its own tokenizer: tokenizer keys without data-path would be ignored."""
    if cfg.data_path:
        return
    given = [key_name(a) for a in ("tokenizer_dir", "vocab_file", "merge_file") if getattr(cfg, a)]
    if cfg.tokenizer_type != "default":
        given.insert(0, "tokenizer-type")
    if given:
        raise UsageError(given[0], "applies to data-path only; the embedded corpus brings its own tokenizer",
                         "set data-path to the dataset this tokenizer made, or drop " + ", ".join(given))


def validate_data_path(data_path: list) -> None:
    """One prefix, or a blend: pairs of WEIGHT PREFIX with numeric, non-negative weights."""
    if len(data_path) <= 1:
        return
    fix = "e.g. data-path='0.7 a_text 0.3 b_text'"
    if len(data_path) % 2:
        raise UsageError("data-path", "a blend is pairs of WEIGHT PREFIX", fix)
    for weight in data_path[0::2]:
        try:
            if not float(weight) >= 0 or math.isinf(float(weight)):
                raise ValueError
        except ValueError:
            raise UsageError("data-path", f"blend weight {weight!r} is not a non-negative number", fix) from None


def validate_split(split: str) -> None:
    """The dataset's split parser, plus what training needs: documents to train on and to validate with."""
    train, valid, _ = split_weights(split, "split")
    for name, weight in (("training", train), ("validation", valid)):
        if weight <= 0:
            raise UsageError("split", f"{split!r} leaves no {name} documents", "give it a share, e.g. split=949,50,1")
