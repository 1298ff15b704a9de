"""The training loop: set up (all checks first), step, evaluate, checkpoint, log; resume exactly."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import math
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptforge.errors import GptforgeError, UsageError
from gptforge.model import GPT
from gptforge.model.kernels import use_flash4, use_gelu_epilogue, use_loss_epilogue
from gptforge.model.layers import LayerBackend, resolve_backend
from gptforge.model.loss import fp8_fits
from gptforge.model.scaled_mm import fp8_matmul_gpu
from gptforge.model.xent import kernel_name as xent_kernel_name
from gptforge.train import checkpoint, data as datamod, distributed, rundir
from gptforge.train.collector import ScheduledCollector
from gptforge.train.config import TrainConfig, validate
from gptforge.train.hopper_keys import apply_hopper_keys
from gptforge.train.engine import DeepSpeedEngine, TorchEngine, read_deepspeed_config
from gptforge.train.estimate import estimate
from gptforge.storage import kill_point, write_atomic
from gptforge.train.metrics import MetricsLog, plot_losses, read_records
from gptforge.train.optim import StepShape, build_optimizer
from gptforge.train.peaks import Peak, lookup, mfu
from gptforge.train.progress import RunProgress
from gptforge.train.precision import Precision, choose


@dataclass
class RunOptions:
    run_dir: Path | None = None  # None: rundir.default_run_dir
    config_name: str = "custom"
    resume: bool = False
    device: str = "auto"
    deepspeed: str | None = None
    fsdp: str | None = None  # the FSDP unit: "block" or "model"; None: no FSDP


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    final_train_loss: float | None = None
    final_val_loss: float | None = None
    first_val_loss: float | None = None
    last_checkpoint: Path | None = None
    plot: Path | None = None
    metrics: Path | None = None
    tensorboard: Path | None = None
    resumed_from: int = 0
    train_passes: float | None = None  # how many times the run's samples go over the training split
    notes: list[str] = field(default_factory=list)


@dataclass
class LaunchedStep:
    """A step queued on the device; its loss and gradient norm arrive in ``values`` once ``ready`` has passed."""
    step: int
    values: torch.Tensor  # (loss, grad norm), host memory
    ready: torch.cuda.Event | None  # None: already there
    lr: float
    t0: float
    start: torch.cuda.Event | None = None  # on the device's timeline where the step began (CUDA only)
    overlapped: bool = False  # queued while the step before it was still running


def copy_to_host(values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A copy to host memory queued behind the work that makes VALUES, and the event that marks it done.

    A plain .item() would wait for everything queued on the stream, the next step included."""
    if values.device.type != "cuda":
        return values, None
    host = values.to("cpu", non_blocking=True)
    return host, recorded_event()


def recorded_event() -> torch.cuda.Event:
    """A timing event recorded on the current stream: where the device has got to, on its own clock."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class NonFiniteLoss(GptforgeError):
    pass


def fp8_context(cfg: TrainConfig, backend: LayerBackend, device: torch.device):
    """TransformerEngine's fp8_autocast when asked for, TE is on and the GPU is sm_89 or newer."""
    if not cfg.fp8:
        return contextlib.nullcontext, None
    if backend.linear != "te":
        return contextlib.nullcontext, "FP8 asked for but TransformerEngine layers are off: bf16/fp16 matmuls"
    if not fp8_matmul_gpu(device):
        return contextlib.nullcontext, "FP8 asked for but needs an sm_89+ GPU: bf16/fp16 matmuls"
    from gptforge.model.fp8 import autocast_factory

    return autocast_factory(cfg.fp8_recipe), f"FP8 (TransformerEngine, HYBRID E4M3/E5M2, {cfg.fp8_recipe} scaling): on"


def bf16_residual(cfg: TrainConfig, backend: LayerBackend, precision: Precision) -> str | None:
    """Turn the bf16 residual stream on in BACKEND when asked for and the run is bf16; the note says which.

    The key means "in bf16 under bf16 autocast" (the GPT-2 configs set it), so an fp16/fp32 run is not a fallback."""
    if not cfg.bf16_residual:
        return None
    if precision.name != "bf16":
        return f"residual stream: float32 (bf16-residual applies to bf16 runs; this run is {precision.name})"
    backend.bf16_residual = True
    return "residual stream: bf16 (weights, LayerNorm statistics and weight gradients float32)"


def compile_arguments(cfg: TrainConfig) -> dict:
    """torch.compile's mode, or with inductor options of our own that mode's options plus ours (it takes one or the other)."""
    ours: dict = {}
    if cfg.compile_combo_kernels:
        ours["combo_kernels"] = True
    if cfg.compile_norm_rows:
        ours["triton.mix_order_reduction_split_size"] = cfg.compile_norm_rows
    if cfg.compile_tied_scatter:
        from gptforge.train.tied_grad import TIED_SCATTER

        ours["post_grad_custom_post_pass"] = TIED_SCATTER
    if not ours:
        return {"mode": None if cfg.compile_mode == "default" else cfg.compile_mode}
    from torch._inductor import list_mode_options

    return {"options": {**list_mode_options(cfg.compile_mode), **ours}}


def compile_note(cfg: TrainConfig) -> str:
    combo = ", combo kernels" if cfg.compile_combo_kernels else ""
    rows = f", LayerNorm-backward partials of {cfg.compile_norm_rows} rows" if cfg.compile_norm_rows else ""
    tied = ", the embedding's gradient scattered into the output layer's" if cfg.compile_tied_scatter else ""
    return f"torch.compile: on, mode {cfg.compile_mode}{combo}{rows}{tied} (first steps include compilation)"


def qkv_bias_gemm(cfg: TrainConfig, backend: LayerBackend) -> str | None:
    """Take the qkv projection's bias gradient from its weight-gradient GEMM when asked for and the layer
    is torch's own (TE's layers and torchao's float8 ones compute theirs); the note says which."""
    if not cfg.qkv_bias_gemm:
        return None
    if backend.linear != "torch":
        return "qkv bias gradient from the GEMM asked for but TransformerEngine layers are on: TE's linear layer"
    if cfg.float8 != "off":
        return f"qkv bias gradient from the GEMM asked for but float8={cfg.float8} is on: torchao's float8 layer"
    backend.qkv_bias_gemm = True
    return "qkv projection: bias gradient from the weight-gradient GEMM (columns of ones beside its input)"


def mlp_bias_gemm(cfg: TrainConfig, backend: LayerBackend) -> str | None:
    """Take the MLP up-projection's bias gradient from its weight-gradient GEMM when asked for and the MLP is
    quack's (gelu-epilogue; torch's computes its own); the note says which."""
    if not cfg.mlp_bias_gemm:
        return None
    if backend.mlp != "quack":
        return "MLP bias gradient from the GEMM asked for but gelu-epilogue is not on: the MLP's own bias gradient"
    backend.mlp_bias_gemm = True
    return "MLP up-projection: bias gradient from the weight-gradient GEMM (columns of ones beside its input)"


def fp8_output(cfg: TrainConfig, backend: LayerBackend, device: torch.device, padded_vocab: int) -> str | None:
    """Turn the FP8 output layer on in BACKEND when asked for and possible; the note says which."""
    if not cfg.fp8_output:
        return None
    if not backend.loss_chunk:
        return "FP8 output layer asked for but needs fused-loss=true: bf16/fp16 output layer"
    if not fp8_matmul_gpu(device):
        return "FP8 output layer asked for but needs an sm_89+ GPU: bf16/fp16 output layer"
    tokens = cfg.micro_batch_size * cfg.seq_length
    if not fp8_fits(tokens, backend.loss_chunk, cfg.hidden_size, padded_vocab):
        return (f"FP8 output layer asked for but tokens per micro batch ({tokens}), loss-chunk-tokens, hidden-size "
                f"and the padded vocabulary ({padded_vocab}) must be multiples of 16: bf16/fp16 output layer")
    backend.loss_fp8, backend.loss_fp8_logits = True, cfg.fp8_output_logits
    if not cfg.fp8_output_logits:
        return "FP8 output layer: on for its two gradient matmuls (bf16 logits; E4M3 hidden states and weights, E5M2 softmax)"
    return "FP8 output layer: on (E4M3 hidden states and weights, E5M2 logits gradient)"


def torchao_float8(cfg: TrainConfig, backend: LayerBackend, model: torch.nn.Module, device: torch.device) -> str | None:
    """Convert the model's block Linear layers to torchao float8 when asked for and possible; the note says which."""
    if cfg.float8 == "off":
        return None
    if backend.linear != "torch":
        return "torchao float8 asked for but TransformerEngine layers are on: use fp8=true for TE's FP8"
    if not fp8_matmul_gpu(device):
        return "torchao float8 asked for but needs an sm_89+ GPU: bf16/fp16 matmuls"
    if importlib.util.find_spec("torchao") is None:
        return "torchao float8 asked for but torchao is not installed: bf16/fp16 matmuls"
    from gptforge.model.fp8 import convert_torchao

    swapped = convert_torchao(model, cfg.float8)
    return f"float8 (torchao, {cfg.float8} scaling): on, {swapped} Linear layers"


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB (peak RSS)


def check_writable(run_dir: Path) -> None:
    """The run directory can be made: a directory can be created (and is removed again) in its nearest
    existing ancestor. Permission bits are not enough: root passes them on /proc and read-only mounts."""
    existing = run_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        os.rmdir(tempfile.mkdtemp(prefix=".gptforge-write-test-", dir=existing))
    except OSError as err:
        raise UsageError("--run-dir", f"{run_dir} cannot be created in {existing}: {err.strerror or err}",
                         "give a --run-dir on a writable file system") from None


class Trainer:
    def __init__(self, cfg: TrainConfig, opts: RunOptions, data: datamod.DataSetup | None = None, console=None):
        self.cfg, self.opts, self.data = cfg, opts, data
        self.run_dir = Path(opts.run_dir) if opts.run_dir else rundir.default_run_dir(opts.config_name, opts.resume)
        self.ckpt_root = self.run_dir / "checkpoints"
        from rich.console import Console

        self.console = console or Console(soft_wrap=True)
        self.notes: list[str] = []
        self.last_step_done = 0.0  # host clock when the last step's loss was read
        self.last_ready: torch.cuda.Event | None = None  # the device's end of the last step read
        self.unread = 0  # steps launched whose loss has not been read
        self.collector = ScheduledCollector(cfg.gc_interval)

    # ---- checks that need no GPU --------------------------------------------------------------
    def preflight(self) -> None:
        cfg, opts = self.cfg, self.opts
        self.world = distributed.env_world_size()
        validate(cfg, self.world)
        device = distributed.pick_device(opts.device, int(os.environ.get("LOCAL_RANK", "0")))
        self.cfg, hopper_note = apply_hopper_keys(cfg, device, bool(opts.deepspeed))  # before anything is written
        cfg = self.cfg
        self.notes += [hopper_note] if hopper_note else []
        self.ds_config = read_deepspeed_config(opts.deepspeed, cfg, self.world) if opts.deepspeed else None
        if opts.deepspeed and importlib.util.find_spec("deepspeed") is None:
            raise UsageError("--deepspeed", "DeepSpeed is not installed", "pip install deepspeed, or train without --deepspeed")
        if self.data is None:
            datamod.check_data_paths(cfg)
        check_writable(self.run_dir)
        if int(os.environ.get("RANK", "0")) == 0:  # before reading checkpoints another run may be writing
            self.lock = rundir.lock(self.run_dir)
        self.resume_ckpt, self.resume_state = None, None
        existing = checkpoint.latest(self.ckpt_root)
        if existing is not None and not opts.resume:
            raise UsageError("--run-dir", f"{self.run_dir} already holds checkpoints (newest {existing.name})",
                             "pass --resume to continue that run, or give a new --run-dir")
        if opts.resume:
            self.resume_ckpt = checkpoint.latest(self.ckpt_root)
            if self.resume_ckpt is not None:
                self.resume_state = checkpoint.read_trainer_state(self.resume_ckpt)
                uses_ds = self.resume_state.get("deepspeed", False)
                if uses_ds != bool(opts.deepspeed):
                    raise UsageError("--resume", f"{self.resume_ckpt.name} was written {'with' if uses_ds else 'without'} DeepSpeed",
                                     "resume with the same engine (--deepspeed CONFIG or none)")
                uses_fsdp = self.resume_state.get("fsdp", False)
                if uses_fsdp != bool(opts.fsdp):
                    raise UsageError("--resume", f"{self.resume_ckpt.name} was written {'with' if uses_fsdp else 'without'} FSDP",
                                     "resume with the same engine (--fsdp or none)")
                if changes := rundir.config_changes(self.run_dir, cfg.to_dict()):
                    self.notes.append(changes)

    # ---- setup -----------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.env, self.device = distributed.init(self.opts.device, bool(self.ds_config), group=bool(self.opts.fsdp))
        if not self.env.is_main:
            from rich.console import Console

            self.console = Console(quiet=True)
        if self.data is None:
            self.data = self.load_data()
        elif self.resume_state is not None:
            checkpoint.check_shape(self.resume_state, cfg.model_config(self.data.vocab_size).shape(), self.resume_ckpt)
        if repeat := datamod.repeat_note(self.data.train):
            self.notes.append(repeat)
        mcfg = cfg.model_config(self.data.vocab_size)
        if self.device.type == "cuda" and cfg.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        checkpoint.seed_all(cfg.seed)
        precision = choose(cfg.precision, self.device)
        backend = resolve_backend(cfg.apex_layernorm, cfg.transformer_engine, cfg.attention_backend,
                                  cfg.loss_chunk_tokens if cfg.fused_loss else 0)
        self.notes += backend.notes
        self.notes += [note for note in (use_flash4(backend, self.device, cfg.dropout),
                                         use_gelu_epilogue(backend, self.device, cfg.gelu_epilogue, cfg.float8),
                                         bf16_residual(cfg, backend, precision), qkv_bias_gemm(cfg, backend),
                                         mlp_bias_gemm(cfg, backend)) if note]
        fp8_output_note = fp8_output(cfg, backend, self.device, mcfg.padded_vocab_size)
        loss_epilogue_note = use_loss_epilogue(backend, self.device, cfg.loss_epilogue, precision.name,
                                               mcfg.padded_vocab_size, mcfg.hidden_size)
        if backend.loss_chunk and not backend.loss_epilogue:
            self.notes.append(f"loss kernel: {xent_kernel_name(self.device)}")
        self.model = GPT(mcfg, backend).to(self.device)
        fp8_ctx, fp8_note = fp8_context(cfg, backend, self.device)
        float8_note = torchao_float8(cfg, backend, self.model, self.device)
        self.notes += [note for note in (fp8_output_note, loss_epilogue_note, fp8_note, float8_note) if note]
        self.accum = cfg.global_batch_size // (cfg.micro_batch_size * self.env.world_size)
        if self.opts.fsdp:  # before the optimizer: its parameters become the shards
            from gptforge.train import fsdp

            self.notes += fsdp.shard(self.model, cfg, precision, self.device, self.env.world_size, compile_arguments(cfg),
                                     self.opts.fsdp)
        optimizer, opt_note = build_optimizer(self.model, cfg, self.device,
                                              StepShape(precision.name, self.env.launched, self.ds_config is not None,
                                                        self.accum > 1))
        if self.ds_config is not None:
            self.engine = DeepSpeedEngine(self.model, optimizer, cfg, self.ds_config,
                                          compile_arguments(cfg) if cfg.compile else None)
            self.notes += self.engine.describe()
            self.notes.append("optimizer: " + ("DeepSpeed's, from its config" if "optimizer" in self.ds_config else opt_note))
        elif self.opts.fsdp:
            self.notes += [f"precision: {precision.note}", f"optimizer: {opt_note}"]
            self.engine = fsdp.FSDPEngine(self.model, optimizer, cfg, precision, self.accum, self.opts.fsdp)
        else:
            self.notes.append(f"precision: {precision.note}")
            self.notes.append(f"optimizer: {opt_note}")
            wrapped = self.model
            if cfg.compile:
                wrapped = torch.compile(self.model, **compile_arguments(cfg))
                self.notes.append(compile_note(cfg))
            if self.env.launched:
                from torch.nn.parallel import DistributedDataParallel as DDP

                wrapped = DDP(wrapped, device_ids=[self.device.index] if self.device.type == "cuda" else None)
                self.notes.append(f"DDP over {self.env.world_size} processes ({self.env.backend})")
            self.engine = TorchEngine(wrapped, self.model, optimizer, cfg, precision, self.accum,
                                      ddp=self.env.launched, fp8_context=fp8_ctx)
        self.step, self.consumed = 0, 0
        if self.resume_ckpt is not None:
            self.engine.load(self.resume_ckpt, self.resume_state)
            self.step, self.consumed = self.resume_state["step"], self.resume_state["consumed_samples"]
            saved_rng = checkpoint.load_rank_rng(self.resume_ckpt, self.env.rank, self.resume_state.get("world_size", 1))
            if saved_rng is not None:
                checkpoint.restore_rng(saved_rng)
            else:
                self.notes.append(f"rank {self.env.rank} has no saved RNG state (the checkpoint was written by "
                                  f"{self.resume_state.get('world_size', 1)} processes): dropout differs from an unbroken run")
        else:
            torch.manual_seed(cfg.seed + self.env.rank)  # dropout differs per rank; weights were seeded alike
        self.peak = lookup(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else Peak("CPU", None, "")
        self.flops_per_token = self.model.flops_per_token(cfg.seq_length)
        self.reader = datamod.BatchReader(self.data.train, cfg.micro_batch_size, self.device, self.data.vocab_size)
        if self.env.is_main:
            self.prepare_run_dir()
        distributed.barrier(self.env)

    def load_data(self) -> datamod.DataSetup:
        default_paths = None
        if not self.cfg.data_path:
            if self.env.local_rank == 0:
                with self.console.status("preparing the embedded default corpus (cached after the first run)"):
                    default_paths = datamod.prepare_default_corpus(self.cfg)
            distributed.barrier(self.env)
            if self.env.local_rank != 0:
                default_paths = datamod.prepare_default_corpus(self.cfg)
        spec, vocab_size = datamod.tokenizer_for(self.cfg, default_paths)
        if self.resume_state is not None:  # before the dataset indices and any GPU work
            checkpoint.check_shape(self.resume_state, self.cfg.model_config(vocab_size).shape(), self.resume_ckpt)
        return datamod.build(self.cfg, default_paths, spec, vocab_size)

    def prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_staging(self.ckpt_root)
        write_atomic(self.run_dir / rundir.CONFIG_NAME, json.dumps(self.cfg.to_dict(), indent=2).encode())  # --config reads it back
        if not (self.run_dir / "tokenizer").exists():
            self.tokenizer = self.data.tokenizer.copy_into(self.run_dir)
        else:
            self.tokenizer = datamod.TokenizerSpec(**self.resume_state["tokenizer"]) if self.resume_state else self.data.tokenizer
        self.metrics = MetricsLog(self.run_dir, resume_step=self.step)

    # ---- the loop --------------------------------------------------------------------------------
    def describe(self) -> None:
        cfg, c = self.cfg, self.console
        c.print(f"[bold]gptforge train[/] {self.opts.config_name}: {cfg.num_layers} layers, width {cfg.hidden_size}, "
                f"{cfg.num_attention_heads} heads, seq {cfg.seq_length}, vocab {self.model.cfg.vocab_size} "
                f"(padded {self.model.cfg.padded_vocab_size}), {self.model.num_params(True) / 1e6:.2f}M parameters")
        c.print(f"device: {self.device}; batch: global {cfg.global_batch_size} = micro {cfg.micro_batch_size} x "
                f"accumulation {self.accum} x data-parallel {self.env.world_size}; {self.data.description}")
        for note in self.notes:
            c.print(f"  {note}")
        c.print(f"  {self.peak.describe()}")
        if self.resume_ckpt is not None:
            c.print(f"resuming from {self.resume_ckpt} (step {self.step})")
        elif self.opts.resume:
            c.print("--resume: no complete checkpoint yet, starting from step 0")

    def evaluate(self, on_batch=None) -> float:
        cfg, env = self.cfg, self.env
        self.engine.train_mode(False)
        total = torch.zeros((), device=self.device)
        batches = cfg.eval_iters * self.accum
        with torch.no_grad():
            for i in range(batches):
                start = datamod.micro_batch_start(0, i, env.rank, env.world_size, cfg.micro_batch_size)
                x, y = datamod.batch(self.data.valid, start, cfg.micro_batch_size, self.device, self.data.vocab_size)
                total += self.engine.eval_loss(x, y).float()
                if on_batch:
                    on_batch()
        self.engine.train_mode(True)
        return distributed.mean_across(total / batches, env).item()

    def train_step(self, on_micro=None) -> dict:
        """One optimizer step, its loss read at once (a host sync)."""
        return self.finish_step(self.launch_step(on_micro))

    def steps(self, until: int, on_micro=None):
        """The records of the steps up to UNTIL, in order. Step N+1 is queued on the device before step N's
        loss is read, so the device never waits for the host's reads; a step after which the loop
        evaluates or saves, and the last, is read before anything else is queued."""
        pending = None
        with self.collector:
            while self.step < until:
                launched = self.launch_step(on_micro)
                self.collector.after_step(self.step)  # while the GPU runs the step just queued
                if pending is not None:
                    yield self.finish_step(pending)
                pending = launched
                if self.syncs_after(self.step) or self.step == until:
                    yield self.finish_step(pending)
                    pending = None

    def syncs_after(self, step: int) -> bool:
        cfg = self.cfg
        return step % cfg.eval_interval == 0 or step % cfg.save_interval == 0 or step == cfg.train_iters

    def launch_step(self, on_micro=None) -> LaunchedStep:
        """Queue one optimizer step (micro batches, clipping, the optimizer) without waiting for it."""
        cfg, env = self.cfg, self.env
        t0 = time.perf_counter()
        began = recorded_event() if self.device.type == "cuda" else None
        overlapped, self.unread = self.unread > 0, self.unread + 1
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            start = datamod.micro_batch_start(self.consumed, micro, env.rank, env.world_size, cfg.micro_batch_size)
            x, y = self.reader.get(start)
            loss_sum += self.engine.micro_step(x, y, is_last=micro == self.accum - 1).float()
            if on_micro:
                on_micro()
        kill_point("step", self.step + 1)
        lr = self.engine.lr()
        norm = self.engine.step()
        next_start = datamod.micro_batch_start(self.consumed + cfg.global_batch_size, 0, env.rank, env.world_size,
                                               cfg.micro_batch_size)
        self.reader.prefetch(next_start)  # while the GPU finishes this step
        self.step += 1
        self.consumed += cfg.global_batch_size
        loss = distributed.mean_across(loss_sum / self.accum, env)
        return LaunchedStep(self.step, *copy_to_host(torch.stack([loss.float(), norm.to(loss.device).float()])), lr, t0,
                            began, overlapped)

    def finish_step(self, launched: LaunchedStep) -> dict:
        """Read a launched step's loss (waiting for it) and make its record; a non-finite loss stops the run."""
        cfg = self.cfg
        if launched.ready is not None:
            launched.ready.synchronize()  # this step's work only: the step queued after it runs on
        loss, norm = launched.values.tolist()
        elapsed = self.step_seconds(launched)
        self.unread -= 1
        if not math.isfinite(loss):
            last = checkpoint.latest(self.ckpt_root)
            raise NonFiniteLoss(f"training loss is {loss} at step {launched.step}",
                                "lower lr or raise lr-warmup-iters, check the data; "
                                + (f"resume from {last.name} with --resume" if last else "no checkpoint was saved yet"))
        tokens_per_s = cfg.global_batch_size * cfg.seq_length / elapsed
        util = mfu(self.flops_per_token, tokens_per_s, self.peak, self.env.world_size)
        return {"kind": "train", "step": launched.step, "loss": loss, "lr": launched.lr, "grad_norm": norm,
                "tokens_per_s": tokens_per_s, "step_ms": elapsed * 1e3, "mfu": util, "mem_gib": memory_gib(self.device)}

    def step_seconds(self, launched: LaunchedStep) -> float:
        """The time a finished step took, each second counted for one step only.

        On CUDA from the device's own clock: from the end of the step before it when it was queued behind that
        one, else from its own start (the first step, compilation included, and the step after a pause to
        evaluate or save). Host clocks would charge a step for when the host happened to look."""
        if launched.ready is None or launched.start is None:  # no device clock: the host's, steps counted once
            done = time.perf_counter()
            seconds = done - max(launched.t0, self.last_step_done)
            self.last_step_done = done
            return seconds
        begin = self.last_ready if launched.overlapped and self.last_ready is not None else launched.start
        self.last_ready = launched.ready
        return begin.elapsed_time(launched.ready) / 1e3

    def save(self) -> Path | None:
        env = self.env
        if env.is_main:
            checkpoint.begin(self.ckpt_root, self.step)
        distributed.barrier(env)
        tmp = checkpoint.staging_dir(self.ckpt_root, self.step)
        try:
            return self.write_checkpoint(tmp)
        except BaseException:
            if env.is_main:  # a failed save (a full disk) leaves the older checkpoints and nothing else
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def write_checkpoint(self, tmp: Path) -> Path | None:
        env = self.env
        self.engine.save_collective(tmp)
        checkpoint.write_rank_files(tmp, env.rank, checkpoint.capture_rng())
        if env.is_main:
            model_state, optim_state, extra = self.engine.state()
            trainer_state = {
                "step": self.step, "consumed_samples": self.consumed, **extra,
                "model_shape": self.model.cfg.shape(), "model_config": vars(self.model.cfg).copy(),
                "config": self.cfg.to_dict(), "tokenizer": vars(self.tokenizer).copy(),
                "deepspeed": self.ds_config is not None, "fsdp": bool(self.opts.fsdp), "world_size": env.world_size,
            }
            checkpoint.write_main_files(tmp, self.step, model_state, optim_state, trainer_state)
        distributed.barrier(env)
        final = checkpoint.commit(self.ckpt_root, self.step, self.cfg.keep_last) if env.is_main else None
        distributed.barrier(env)
        return final

    def log_line(self, r: dict) -> str:
        util = f"{r['mfu'] * 100:5.1f}% MFU" if r["mfu"] is not None else "MFU n/a"
        return (f"step {r['step']:>6}/{self.cfg.train_iters} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
                f"norm {r['grad_norm']:.3f} | {r['tokens_per_s']:,.0f} tok/s | {r['step_ms']:.0f} ms | {util} | "
                f"mem {r['mem_gib']:.2f} GiB")

    def plot(self) -> Path:
        return plot_losses(self.metrics.path, self.run_dir / "loss.png", f"{self.opts.config_name}: loss")

    def run(self) -> RunResult:
        self.lock = None
        try:
            self.preflight()
            self.setup()
            try:
                return self.loop()
            finally:
                if self.env.is_main:
                    self.metrics.close()
                distributed.shutdown(self.env)
        finally:
            if self.lock is not None:
                self.lock.release()

    def loop(self) -> RunResult:
        cfg, main = self.cfg, self.env.is_main
        self.describe()
        if main:
            self.console.print(estimate(cfg, self.model.cfg.vocab_size, self.device, world_size=self.env.world_size,
                                        steps_left=cfg.train_iters - self.step, config_name=self.opts.config_name).describe())
        result = RunResult(self.run_dir, cfg.train_iters, resumed_from=self.step, notes=self.notes,
                           train_passes=getattr(self.data.train, "passes", None))
        with RunProgress(self.console, enabled=main, total=cfg.train_iters * self.accum,
                         done=self.step * self.accum) as bar:
            if self.step == 0:
                result.first_val_loss = self.evaluate(bar.validation(cfg.eval_iters * self.accum))
                if main:
                    self.metrics.write({"kind": "eval", "step": 0, "loss": result.first_val_loss})
                    self.console.print(f"validation loss before training: {result.first_val_loss:.4f}")
            elif main:  # resumed: the run's history is in its metrics (kept up to the checkpoint's step)
                evals = read_records(self.metrics.path, "eval")
                result.first_val_loss = evals[0]["loss"] if evals and evals[0]["step"] == 0 else None
                result.final_val_loss = evals[-1]["loss"] if evals and evals[-1]["step"] > 0 else None
            # the generator lives on this frame's stack only, so an error here closes it (and hands the garbage
            # collector back) as it unwinds, even while the error is still held
            for record in self.steps(cfg.train_iters, bar.advance):
                self.take_record(record, result, bar, main)
        if main:
            result.metrics = self.metrics.path
            result.tensorboard = self.run_dir / "tensorboard"
            result.plot = self.plot()
            result.last_checkpoint = checkpoint.latest(self.ckpt_root)
        return result

    def take_record(self, record: dict, result: RunResult, bar, main: bool) -> None:
        """Log a read step; after a step that syncs, evaluate and save as the config says."""
        cfg = self.cfg
        result.final_train_loss = record["loss"]
        if main:
            self.metrics.write(record)
            bar.info(f"loss {record['loss']:.4f}")
            if record["step"] % cfg.log_interval == 0 or record["step"] == 1:
                self.console.print(self.log_line(record))
        if not self.syncs_after(record["step"]):
            return  # the next step is already queued: evaluations and checkpoints wait for the steps they follow
        if self.step % cfg.eval_interval == 0 or self.step == cfg.train_iters:
            result.final_val_loss = self.evaluate(bar.validation(cfg.eval_iters * self.accum))
            if main:
                self.metrics.write({"kind": "eval", "step": self.step, "loss": result.final_val_loss})
                self.console.print(f"step {self.step:>6}/{cfg.train_iters} | validation loss {result.final_val_loss:.4f}")
                result.plot = self.plot()  # at every evaluation: an interrupted run has one too
        if self.step % cfg.save_interval == 0 or self.step == cfg.train_iters:
            result.last_checkpoint = self.save()


def train(cfg: TrainConfig, opts: RunOptions, data: datamod.DataSetup | None = None, console=None) -> RunResult:
    return Trainer(cfg, opts, data, console).run()
