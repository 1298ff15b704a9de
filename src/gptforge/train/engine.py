"""The two ways a step is executed: plain torch (one process or DDP) and the DeepSpeed engine.

Both expose the same small interface to the loop: ``micro_step`` (forward + backward of one micro
batch), ``step`` (optimizer step at the accumulation boundary, returns the grad norm), ``lr``, and the
checkpoint hooks. Checkpoint directories and the commit protocol belong to train.checkpoint.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import pickle
from pathlib import Path

import torch

from gptforge.errors import GptforgeError, UsageError
from gptforge.train import checkpoint
from gptforge.train.config import TrainConfig
from gptforge.train.master import MasterAdamW, float32_weights, without_masters
from gptforge.train.optim import build_scheduler, clipped_step, param_groups
from gptforge.train.precision import Precision


class TorchEngine:
    def __init__(self, model, raw_model, optimizer, cfg: TrainConfig, precision: Precision, accum: int, ddp: bool,
                 fp8_context=None):
        self.model, self.raw_model, self.optimizer = model, raw_model, optimizer
        self.scheduler = build_scheduler(optimizer, cfg)
        self.precision = precision
        self.scaler = precision.make_scaler()
        self.accum, self.ddp = accum, ddp
        self.clip = cfg.clip_grad
        self.fp8_context = fp8_context or contextlib.nullcontext
        # apex FusedAdam.zero_grad() takes no set_to_none (it frees grads by its set_grad_none default)
        takes = inspect.signature(optimizer.zero_grad).parameters
        self.zero_grad_kwargs = {"set_to_none": True} if "set_to_none" in takes else {}
        self.cudagraphs = uses_cudagraphs(cfg)
        self.kept_grads = own_grad_buffers(raw_model, optimizer) if self.cudagraphs and accum > 1 else None

    def micro_step(self, x, y, is_last: bool) -> torch.Tensor:
        sync = contextlib.nullcontext() if (is_last or not self.ddp) else self.model.no_sync()
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # this micro batch's replay may reuse the last one's outputs
        with sync:
            with self.precision.autocast(), self.fp8_context():
                _, loss = self.model(x, y)
            scaled = loss / self.accum
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return loss.detach()

    def step(self) -> torch.Tensor:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.clip if self.clip > 0 else math.inf
        if self.scaler:
            norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            norm = clipped_step(self.optimizer, list(self.raw_model.parameters()), max_norm)
        self.scheduler.step()
        if self.kept_grads is None:
            self.optimizer.zero_grad(**self.zero_grad_kwargs)
        else:
            torch._foreach_zero_(self.kept_grads)
        return norm.detach()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def eval_loss(self, x, y) -> torch.Tensor:
        with self.precision.autocast(), self.fp8_context():
            return self.model(x, y)[1].detach()

    def train_mode(self, on: bool) -> None:
        self.model.train(on)

    def state(self) -> tuple[dict, dict, dict]:
        """(model, optimizer, extra trainer state) to save from rank 0."""
        extra = {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None}
        model_state = (self.optimizer.model_state(self.raw_model) if isinstance(self.optimizer, MasterAdamW)
                       else self.raw_model.state_dict())
        return model_state, self.optimizer.state_dict(), extra

    def save_collective(self, tmp: Path) -> None:
        """Nothing: torch state is gathered on every rank already (DDP replicas)."""

    def load(self, ckpt: Path, trainer_state: dict) -> None:
        model_state = checkpoint.load_verified(ckpt, "model.pt")
        self.raw_model.load_state_dict(model_state)
        # either optimizer resumes the other's state: bf16-weights may differ from the run's first part
        # (a key given on resume, or hopper-kernels adding it to a run that began without it)
        optimizer_state = checkpoint.load_verified(ckpt, "optimizer.pt")
        if isinstance(self.optimizer, MasterAdamW):
            self.optimizer.load_state_dict(optimizer_state, float32_weights(self.raw_model, model_state))
        else:
            self.optimizer.load_state_dict(without_masters(optimizer_state))
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        if self.scaler and trainer_state.get("scaler"):
            self.scaler.load_state_dict(trainer_state["scaler"])


def uses_cudagraphs(cfg: TrainConfig) -> bool:
    """Whether the compiled step runs as CUDA graphs (torch.compile's cudagraph trees)."""
    return cfg.compile and cfg.compile_mode in ("reduce-overhead", "max-autotune")


def own_grad_buffers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Zeroed .grad buffers for every trainable parameter, kept for the whole run (but those whose gradients
    OPTIMIZER adds into float32 sums of its own as each backward hands them over).

    Under CUDA graphs a backward's gradients are memory of the graph, which its next replay overwrites; a
    parameter without a .grad takes that memory as its .grad, so the next micro batch of an accumulation
    would overwrite (or fail on) what the first one left. With buffers of its own each micro batch's
    gradient is added into them (pytorch/pytorch#169545)."""
    grads = []
    summed = optimizer.accumulated if isinstance(optimizer, MasterAdamW) else lambda p: False
    for param in model.parameters():
        if param.requires_grad and not summed(param):
            param.grad = torch.zeros_like(param)
            grads.append(param.grad)
    return grads


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


def read_deepspeed_config(path: str, cfg: TrainConfig, world_size: int) -> dict:
    """The user's DeepSpeed JSON, checked against the run's batch sizes and completed from the config."""
    path = resolve_deepspeed_config(path)
    try:
        ds = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError("--deepspeed", f"{path} not found", "give a DeepSpeed JSON config, e.g. the packaged zero2.json") from None
    except json.JSONDecodeError as err:
        raise UsageError("--deepspeed", f"{path} is not valid JSON: {err}", "fix the file") from None
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
    if ds.get("bf16", {}).get("enabled") and ds.get("fp16", {}).get("enabled"):
        raise UsageError("--deepspeed", "both bf16 and fp16 are enabled", "enable one")
    return ds


def without_cudagraphs(compile_kwargs: dict) -> tuple[dict, str]:
    """torch.compile's arguments with CUDA graphs off, for an engine whose collectives and hooks run between
    the compiled pieces (FSDP, DeepSpeed), and the note's words for what changed."""
    if "options" in compile_kwargs:
        options = {**compile_kwargs["options"], "triton.cudagraphs": False}
        options.pop("post_grad_custom_post_pass", None)  # the tied-scatter pass needs the whole model in one graph
        return {"options": options}, ", CUDA graphs off (the engine's collectives run between compiled pieces)"
    mode = compile_kwargs.get("mode")
    if mode in CUDAGRAPH_MODES:
        return ({"mode": CUDAGRAPH_MODES[mode]},
                f", mode {CUDAGRAPH_MODES[mode] or 'default'} ({mode}'s CUDA graphs are off under this engine)")
    return compile_kwargs, f", mode {mode or 'default'}"


CUDAGRAPH_MODES = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}


def compile_blocks(model: torch.nn.Module, compile_kwargs: dict) -> str:
    """Compile each transformer block of MODEL in place, on its own (torchtitan's recipe for sharded engines):
    a block's gradients are ready, and its collectives can start, as soon as its backward ends. Returns the note."""
    compile_kwargs, how = without_cudagraphs(compile_kwargs)
    for block in model.blocks:
        block.compile(**compile_kwargs)
    return f"torch.compile: on, each of the {len(model.blocks)} blocks on its own{how} (first steps include compilation)"


class DeepSpeedEngine:
    def __init__(self, raw_model, optimizer, cfg: TrainConfig, ds_config: dict, compile_kwargs: dict | None = None):
        """COMPILE_KWARGS: torch.compile's arguments; None: eager. Where the DeepSpeed config turns DeepCompile on,
        the whole module is compiled under the engine (its passes place ZeRO's collectives in the graph); else
        under ZeRO-1/2 each block is compiled on its own before the engine wraps the model, and under ZeRO-3 the
        step stays eager: its hooks swap each layer's weights in and out, and every block recompiles until
        torch.compile's recompile limit sends it back to eager anyway."""
        import deepspeed

        deep = bool(ds_config.get("compile", {}).get("deepcompile"))
        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        self.compile_note = "torch.compile: off (compile=false)"
        if compile_kwargs is not None and not deep:
            self.compile_note = (compile_blocks(raw_model, compile_kwargs) if stage < 3 else
                                 'torch.compile: off under ZeRO-3 without DeepCompile (its parameter gathering '
                                 'recompiles every block); "compile": {"deepcompile": true} in the DeepSpeed config compiles it')

        self.raw_model = raw_model
        self.ds_config = ds_config
        client_opt = None if "optimizer" in ds_config else optimizer
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=raw_model, optimizer=client_opt,
            model_parameters=param_groups(raw_model, cfg.weight_decay) if client_opt is None else None,
            lr_scheduler=lambda opt: build_scheduler(opt, cfg), config=ds_config,
        )
        self.zero_stage = stage
        self.precision_name = "bf16" if ds_config.get("bf16", {}).get("enabled") else "fp16" if ds_config.get("fp16", {}).get("enabled") else "fp32"
        if compile_kwargs is not None and deep:
            compile_kwargs, how = without_cudagraphs(compile_kwargs)
            self.engine.compile(compile_kwargs=compile_kwargs)
            self.compile_note = f"torch.compile: on, the whole module under the engine with DeepCompile{how} (first steps include compilation)"

    def describe(self) -> list[str]:
        return [f"DeepSpeed engine: ZeRO stage {self.zero_stage}, {self.precision_name} (from the DeepSpeed config)",
                self.compile_note]

    def micro_step(self, x, y, is_last: bool) -> torch.Tensor:
        _, loss = self.engine(x, y)
        self.engine.backward(loss)
        if not is_last:
            self.engine.step()  # not an accumulation boundary: DeepSpeed only counts the micro step
        return loss.detach().float()

    def step(self) -> torch.Tensor:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return torch.tensor(float(norm) if norm is not None else float("nan"))

    def lr(self) -> float:
        return self.engine.get_lr()[0]

    def eval_loss(self, x, y) -> torch.Tensor:
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
        try:
            with force_weights_only(deepspeed_safe_globals()):
                path, _ = self.engine.load_checkpoint(str(ckpt), tag="deepspeed", load_optimizer_states=True,
                                                      load_lr_scheduler_states=True)
        except pickle.UnpicklingError as err:
            raise GptforgeError(f"refused to read the DeepSpeed state in {ckpt / 'deepspeed'}: "
                                f"{(str(err).splitlines() or [''])[0][:160]}", "use a checkpoint you trust") from None
        if path is None:
            raise UsageError("--resume", f"{ckpt} has no DeepSpeed state", "resume a DeepSpeed run with --deepspeed, a torch run without")
