"""Training under the DeepSpeed engine (``--deepspeed CONFIG``): its JSON config checked against the run, the
engine with the same small interface as train/engine.py's TorchEngine, and its checkpoints read weights-only."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pickle
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from packaging.version import InvalidVersion, Version

from gptforge.core.findings import Finding, Severity
from gptforge.core.installed import installed_version
from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.reading import read_json
from gptforge.train import checkpoint
from gptforge.train.config import TrainConfig
from gptforge.train.deepspeed_waits import stop_host_waits
from gptforge.train.optim import build_scheduler, param_groups

EVAL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def deepspeed_safe_globals() -> list:
    """The DeepSpeed classes its own checkpoints hold besides tensors and plain values (ZeRO stage,
    loss scaler, parameter fragment map): plain data, allowed to the weights-only unpickler."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


@contextlib.contextmanager
def force_weights_only(allowed: list | None = None):
    """Make every torch.load inside weights-only, even one whose caller asks for unpickling
    (DeepSpeed's load_checkpoint does): torch honours TORCH_FORCE_WEIGHTS_ONLY_LOAD over the argument."""
    saved = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed or []):
            yield
    finally:
        if saved is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved


def resolve_deepspeed_config(name_or_path: str) -> str:
    """A JSON path, or the name of a packaged one: zero1, zero2, zero3, zero2-fp16."""
    from importlib import resources

    packaged = resources.files("gptforge") / "configs" / "deepspeed" / f"{name_or_path}.json"
    if not Path(name_or_path).is_file() and packaged.is_file():
        return str(packaged)
    return name_or_path


def require_deepspeed() -> None:
    if importlib.util.find_spec("deepspeed") is None:
        raise UsageError("--deepspeed", "DeepSpeed is not installed", "pip install deepspeed, or train without --deepspeed")


def read_deepspeed_config(path: str, cfg: TrainConfig, world_size: int) -> dict:
    """The user's DeepSpeed JSON, checked against the run's batch sizes and completed from the config."""
    path = resolve_deepspeed_config(path)
    try:
        ds = read_json(path, max_bytes=1 << 20, expect=dict, fix="give a DeepSpeed JSON object, e.g. the packaged zero2.json")
    except FileReadError as err:
        raise UsageError("--deepspeed", err.message, err.fix) from None
    accum = cfg.global_batch_size // (cfg.micro_batch_size * world_size)
    wanted = {"train_micro_batch_size_per_gpu": cfg.micro_batch_size, "gradient_accumulation_steps": accum,
              "train_batch_size": cfg.global_batch_size}
    for key, value in wanted.items():
        if key in ds and ds[key] != "auto" and ds[key] != value:
            raise UsageError("--deepspeed", f"{key}={ds[key]} in {Path(path).name} disagrees with the run config ({value})",
                             f"remove {key} from the JSON (it is derived from micro/global batch) or set it to {value}")
        ds[key] = value
    ds.setdefault("gradient_clipping", cfg.clip_grad)
    ds.setdefault("zero_allow_untested_optimizer", True)  # our torch AdamW under ZeRO
    ds.setdefault("steps_per_print", 10**9)  # the trainer logs; keep DeepSpeed quiet
    # DeepSpeed's throughput timer waits for the device at every forward and step() (each micro batch here), which
    # stops the host from queueing ahead; the trainer times steps on the device's own clock
    ds.setdefault("timers", {"throughput": {"enabled": False}})
    if ds.get("bf16", {}).get("enabled") and ds.get("fp16", {}).get("enabled"):
        raise UsageError("--deepspeed", "both bf16 and fp16 are enabled", "enable one")
    check_deepspeed_knows(ds, Path(path).name)
    return ds


def check_deepspeed_knows(ds: dict, name: str) -> None:
    """DeepSpeed refuses a key it does not know with a traceback; say which release brought it instead."""
    version = installed_version("deepspeed")
    try:
        installed = Version(version) if version else None
    except InvalidVersion:
        installed = None
    if installed is None:  # not installed, its metadata unreadable, or a version packaging cannot read
        return
    if "check_grad_overflow" in ds.get("bf16", {}) and installed < Version("0.17.1"):
        raise UsageError("--deepspeed", f"{name} sets bf16.check_grad_overflow, which DeepSpeed has since 0.17.1 "
                         f"(installed: {installed})", "upgrade DeepSpeed (the environments lock a newer one), or "
                         "remove the key from the JSON")


def deepcompile_unavailable(resuming: bool = False, zero3_evaluates_midrun: bool = False) -> str | None:
    """Why DeepCompile cannot run here: its op cannot be loaded or built (DeepSpeed builds it at the first compiled
    step), the run resumes from a checkpoint, or it evaluates mid-run under ZeRO-3; None where it can.
    The last two abort the run: DeepCompile's first backward after an evaluation graph compiled later than the
    training graph fails an assertion in its reduce buckets (DoubleBufferedReduceBucket::swap; a resumed run
    compiles training first, and ZeRO-3 recompiles training at its step-5 passes; bench/results/sharded.md)."""
    if resuming:
        return "DeepSpeed's DeepCompile cannot resume from a checkpoint"
    if zero3_evaluates_midrun:
        return ("under ZeRO-3 DeepSpeed's DeepCompile aborts at the first step after a mid-run evaluation; "
                "set eval-interval to at least train-iters to run it")
    if not torch.cuda.is_available():
        return "it needs a CUDA device"
    try:
        if importlib.util.find_spec("deepspeed.ops.dc_op") is not None:  # built at install (DS_BUILD_DEEP_COMPILE=1)
            return None
    except ModuleNotFoundError:
        return "DeepSpeed is not installed"
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit found to build its op (put nvcc on PATH or set CUDA_HOME)"
    if not cpp_extension.is_ninja_available():
        return "ninja, which builds its op, is not installed"
    return unreadable_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))


def unreadable_arch_list(arch_list: str) -> str | None:
    """Why DeepSpeed's JIT op builder would fail on ARCH_LIST, or None. It reads every dotted part of an entry as
    an integer (deepspeed/ops/op_builder/builder.py, compute_capability_args), so torch's arch-specific entries
    such as 9.0a end the first compiled step with a ValueError."""
    entries = arch_list.replace(" ", ";").split(";")
    bad = [e for e in entries if e.strip() and not all(p.split("+")[0].isdigit() for p in e.strip().split("."))]
    if not bad:
        return None
    fixed = ";".join(e.strip().split("+")[0].rstrip("abf") for e in entries if e.strip())
    return (f"TORCH_CUDA_ARCH_LIST={arch_list} has {', '.join(bad)}, which DeepSpeed's op builder cannot read; "
            f"set TORCH_CUDA_ARCH_LIST={fixed} for this run to build its op")


class DeepSpeedEngine:
    def __init__(self, raw_model, optimizer, cfg: TrainConfig, ds_config: dict, compile_options: dict | None = None,
                 resuming: bool = False):
        """COMPILE_OPTIONS: torch.compile's arguments; None: eager. Under ZeRO-1/2, or with DeepCompile on in the
        DeepSpeed config, the whole module is compiled under the engine, one graph as under DDP; DeepCompile also
        puts ZeRO's gradient reductions into that graph (bench/results/sharded.md). Under ZeRO-3 without
        DeepCompile the step stays eager: its hooks on every layer would be traced into the graph and recompile
        it for each layer."""
        import deepspeed

        deep = bool(ds_config.get("compile", {}).get("deepcompile"))
        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        self.engine_notes = []
        if deep and compile_options is not None and (missing := deepcompile_unavailable(
                resuming, stage == 3 and cfg.eval_interval < cfg.train_iters)):
            deep = False
            ds_config = {**ds_config, "compile": {**ds_config["compile"], "deepcompile": False}}
            self.engine_notes.append(Finding("deepcompile-unavailable", Severity.WARNING, f"DeepCompile: off, {missing}"))
        # Under DeepCompile the no-grad graph (evaluation) fails on cuDNN attention, whose log-sum-exp output is
        # then undefined; evaluation picks flash or memory-efficient attention, training keeps cuDNN's
        self.eval_attention = (functools.partial(sdpa_kernel, EVAL_ATTENTION) if deep and compile_options is not None
                               else contextlib.nullcontext)
        whole = compile_options is not None and (deep or stage < 3)
        self.compile_note = Finding("compile-off", Severity.INFO, "torch.compile: off (compile=false)")
        if compile_options is not None and not whole:
            self.compile_note = Finding(
                "compile-off-zero3", Severity.WARNING, "torch.compile: off under ZeRO-3 without DeepCompile (its "
                "hooks on every layer would break each block's graph); \"compile\": {\"deepcompile\": true} in the "
                "DeepSpeed config compiles it in runs that start fresh and evaluate only at the end (eval-interval at "
                "least train-iters)")

        self.raw_model = raw_model
        self.ds_config = ds_config
        client_opt = None if "optimizer" in ds_config else optimizer
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=raw_model, optimizer=client_opt,
            model_parameters=param_groups(raw_model, cfg.weight_decay) if client_opt is None else None,
            lr_scheduler=lambda opt: build_scheduler(opt, cfg), config=ds_config,
        )
        self.zero_stage = stage
        if stop_host_waits(self.optimizer):
            self.engine_notes.append(Finding("deepspeed-step", Severity.INFO, "DeepSpeed's optimizer step: the gradient "
                                               "norm's mask and the clip on the device, without its host reads"))
        self.precision_name = "bf16" if ds_config.get("bf16", {}).get("enabled") else "fp16" if ds_config.get("fp16", {}).get("enabled") else "fp32"
        if whole:
            self.engine.compile(compile_kwargs=compile_options)
            self.compile_note = (Finding("compile-deepcompile", Severity.INFO, "torch.compile: on, the whole module "
                                         "under the engine with DeepCompile (first steps include compilation)") if deep else
                                 Finding("compile-module", Severity.INFO, "torch.compile: on, the whole module under "
                                         "the engine (first steps include compilation)"))

    def describe(self, optimizer_note: Finding) -> list[Finding]:
        """The run's notes on the engine; OPTIMIZER_NOTE: the trainer's optimizer, used unless the config names one."""
        if "optimizer" in self.ds_config:
            optimizer_note = Finding("optimizer", Severity.INFO, "optimizer: DeepSpeed's, from its config")
        return [Finding("deepspeed", Severity.INFO, f"DeepSpeed engine: ZeRO stage {self.zero_stage}, "
                        f"{self.precision_name} (from the DeepSpeed config)"), *self.engine_notes, self.compile_note,
                optimizer_note]

    def micro_step(self, x, y, is_last: bool) -> torch.Tensor:
        _, loss = self.engine(x, y)
        self.engine.backward(loss)
        if not is_last:
            self.engine.step()  # not an accumulation boundary: DeepSpeed only counts the micro step
        return loss.detach().float()

    def step(self) -> torch.Tensor:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()  # ZeRO's is a device tensor: read with the loss, not here
        if torch.is_tensor(norm):
            return norm.detach().float()
        return torch.tensor(float(norm) if norm is not None else float("nan"))

    def lr(self) -> float:
        return self.engine.get_lr()[0]

    def eval_loss(self, x, y) -> torch.Tensor:
        with self.eval_attention():
            return self.engine(x, y)[1].detach().float()

    def train_mode(self, on: bool) -> None:
        self.engine.train(on)

    def state(self) -> tuple[dict | None, None, dict]:
        # model.pt (16-bit weights, for `gptforge sample`) when the weights are whole on each rank
        model_state = self.engine.module.state_dict() if self.zero_stage < 3 else None
        return model_state, None, {"scheduler": None, "scaler": None}

    def save_collective(self, tmp: Path) -> None:
        self.engine.save_checkpoint(str(tmp), tag="deepspeed", save_latest=False)

    def load(self, ckpt: Path, trainer_state: dict) -> None:
        checkpoint.verify(ckpt)
        for path in sorted((ckpt / "deepspeed").rglob("*.pt")):
            checkpoint.check_unpacked(path)
        try:
            with force_weights_only(deepspeed_safe_globals()):
                path, _ = self.engine.load_checkpoint(str(ckpt), tag="deepspeed", load_optimizer_states=True,
                                                      load_lr_scheduler_states=True)
        except pickle.UnpicklingError as err:
            raise GptforgeError(f"refused to read the DeepSpeed state in {ckpt / 'deepspeed'}: "
                                f"{(str(err).splitlines() or [''])[0][:160]}", "use a checkpoint you trust") from None
        if path is None:
            raise UsageError("--resume", f"{ckpt} has no DeepSpeed state", "resume a DeepSpeed run with --deepspeed, a torch run without")
