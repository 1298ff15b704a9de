"""The training loop: set up (all checks first), step, evaluate, checkpoint, log; resume exactly."""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptforge import accel
from gptforge.core.findings import Finding, Severity
from gptforge.errors import GptforgeError, UsageError
from gptforge.model.gpt import GPT
from gptforge.storage import kill_point, write_atomic
from gptforge.train import checkpoint, data as datamod, distributed, fsdp, rundir, sizes
from gptforge.train.config import TrainConfig, validate
from gptforge.train.cpu_threads import use_idle_cores
from gptforge.train.engine import TorchEngine
from gptforge.train.estimate import estimate
from gptforge.train.metrics import MetricsLog, read_records, step_line
from gptforge.train.optim import build_optimizer
from gptforge.train.peaks import Peak, lookup, mfu
from gptforge.train.precision import choose
from gptforge.train.preempt import StopOnSigterm
from gptforge.train.progress import RunProgress
from gptforge.train.steptime import LaunchedStep, StepClock, copy_to_host, memory_gib, recorded_event


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
    stopped_at: int | None = None  # SIGTERM: the step the run saved before it stopped short of train-iters
    notes: list[Finding] = field(default_factory=list)  # a warning: the run is not quite what was asked


class NonFiniteLoss(GptforgeError):
    pass


class Trainer:
    def __init__(self, cfg: TrainConfig, opts: RunOptions, data: datamod.DataSetup | None = None, console=None):
        self.cfg, self.opts, self.data = cfg, opts, data
        self.run_dir = Path(opts.run_dir) if opts.run_dir else rundir.default_run_dir(opts.config_name, opts.resume)
        self.ckpt_root = self.run_dir / "checkpoints"
        from rich.console import Console

        self.console = console or Console(soft_wrap=True)
        self.notes: list[Finding] = []
        self.stop = StopOnSigterm()
        self.clock = StepClock()
        self.unread = 0  # steps launched whose loss has not been read

    def preflight(self) -> None:
        cfg, opts = self.cfg, self.opts
        self.world = distributed.env_world_size()
        validate(cfg, self.world)
        device = distributed.pick_device(opts.device, int(os.environ.get("LOCAL_RANK", "0")))
        sizes.check_run(cfg, device, self.world, deepspeed=bool(opts.deepspeed))  # a size far out of range: one line
        accel.check(cfg.accel, device, choose(cfg.precision, device).name, cfg.dropout)  # before anything is written
        self.ds_config = None
        if opts.deepspeed:
            from gptforge.train.deepspeed_engine import read_deepspeed_config, require_deepspeed

            self.ds_config = read_deepspeed_config(opts.deepspeed, cfg, self.world)
            require_deepspeed()
        if self.data is None:
            datamod.check_data_paths(cfg)
        rundir.check_writable(self.run_dir)
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
                checkpoint.check_engine(self.resume_state, self.resume_ckpt, bool(opts.deepspeed), bool(opts.fsdp))
                if changes := rundir.config_changes(self.run_dir, cfg.to_dict()):
                    self.notes.append(changes)

    def setup(self) -> None:
        cfg = self.cfg
        self.env, self.device = distributed.init(self.opts.device, bool(self.ds_config), group=bool(self.opts.fsdp))
        self.notes += [note] if (note := use_idle_cores(self.device)) else []
        if not self.env.is_main:
            from rich.console import Console

            self.console = Console(quiet=True)
        if self.data is None:
            self.data = datamod.load(cfg, self.env, self.console.status, self.check_shape)
        else:
            self.check_shape(self.data.vocab_size)
        self.notes += [note] if (note := datamod.repeat_note(self.data.train)) else []
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        checkpoint.seed_all(cfg.seed)
        precision = choose(cfg.precision, self.device)
        self.model = GPT(cfg.model_config(self.data.vocab_size)).to(self.device)
        sizes.check_run(cfg, self.device, self.env.world_size, self.model.cfg.padded_vocab_size, self.model.loss.chunk,
                        deepspeed=self.ds_config is not None)
        speed = accel.accelerate(self.model, cfg.accel, self.device, precision.name,
                                 cuda_graphs=cfg.compile and self.ds_config is None and not self.opts.fsdp)
        self.notes += speed.notes
        self.accum = cfg.global_batch_size // (cfg.micro_batch_size * self.env.world_size)
        if self.opts.fsdp:  # before the optimizer: its parameters become the shards
            self.notes += fsdp.shard(self.model, cfg, precision, self.device, self.env.world_size,
                                     speed.compile_options, self.opts.fsdp)
        optimizer, opt_note = build_optimizer(self.model, cfg, speed.fused_optimizer)
        if self.ds_config is not None:
            from gptforge.train.deepspeed_engine import DeepSpeedEngine

            self.engine = DeepSpeedEngine(self.model, optimizer, cfg, self.ds_config,
                                          speed.compile_options if cfg.compile else None, self.resume_ckpt is not None)
            self.notes += self.engine.describe(opt_note)
        elif self.opts.fsdp:
            self.notes += [precision.note, opt_note]
            self.engine = fsdp.FSDPEngine(self.model, optimizer, cfg, precision, self.accum, self.opts.fsdp)
        else:
            self.notes += [precision.note, opt_note]
            wrapped = self.model
            if cfg.compile:
                wrapped = torch.compile(self.model, **speed.compile_options)
                self.notes.append(Finding("compile", Severity.INFO, "torch.compile: on (first steps include compilation)"))
            if self.env.launched:
                from torch.nn.parallel import DistributedDataParallel as DDP

                wrapped = DDP(wrapped, device_ids=[self.device.index] if self.device.type == "cuda" else None)
                self.notes.append(Finding("ddp", Severity.INFO, f"DDP over {self.env.world_size} processes ({self.env.backend})"))
            cuda_graphs = cfg.compile and speed.cuda_graphs
            self.engine = TorchEngine(wrapped, self.model, optimizer, cfg, precision, self.accum,
                                      ddp=self.env.launched, cuda_graphs=cuda_graphs)
        self.step, self.consumed = 0, 0
        if self.resume_ckpt is not None:
            with checkpoint.state_errors(self.resume_ckpt):
                self.engine.load(self.resume_ckpt, self.resume_state)
            self.step, self.consumed = self.resume_state["step"], self.resume_state["consumed_samples"]
            written_by = self.resume_state.get("world_size", 1)
            saved_rng = checkpoint.load_rank_rng(self.resume_ckpt, self.env.rank, written_by)
            if saved_rng is not None:
                checkpoint.restore_rng(saved_rng)
            else:
                self.notes.append(Finding("resume-rng-missing", Severity.WARNING, f"rank {self.env.rank} has no saved RNG state "
                                          f"(the checkpoint was written by {written_by} processes): dropout differs from an unbroken run"))
        else:
            torch.manual_seed(cfg.seed + self.env.rank)  # dropout differs per rank; weights were seeded alike
        self.peak = lookup(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else Peak("CPU", None, "")
        self.notes.append(self.peak.note())
        self.flops_per_token = self.model.flops_per_token(cfg.seq_length)
        self.reader = datamod.BatchReader(self.data.train, cfg.micro_batch_size, self.device, self.data.vocab_size)
        if self.env.is_main:
            self.prepare_run_dir()
        distributed.barrier(self.env)

    def check_shape(self, vocab_size: int) -> None:
        """On resume, before the dataset indices and any GPU work: the checkpoint holds this config's model."""
        if self.resume_state is not None:
            checkpoint.check_shape(self.resume_state, self.cfg.model_config(vocab_size).shape(), self.resume_ckpt)

    def prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_staging(self.ckpt_root)
        write_atomic(self.run_dir / rundir.CONFIG_NAME, json.dumps(self.cfg.to_dict(), indent=2).encode())  # --config reads it back
        if not (self.run_dir / "tokenizer").exists():
            self.tokenizer = self.data.tokenizer.copy_into(self.run_dir)
        else:
            self.tokenizer = datamod.TokenizerSpec(**self.resume_state["tokenizer"]) if self.resume_state else self.data.tokenizer
        self.metrics = MetricsLog(self.run_dir, resume_step=self.step)

    def describe(self) -> None:
        cfg, c = self.cfg, self.console
        c.print(f"[bold]gptforge train[/] {self.opts.config_name}: {cfg.num_layers} layers, width {cfg.hidden_size}, "
                f"{cfg.num_attention_heads} heads, seq {cfg.seq_length}, vocab {self.model.cfg.vocab_size} "
                f"(padded {self.model.cfg.padded_vocab_size}), {self.model.num_params(True) / 1e6:.2f}M parameters")
        c.print(f"device: {self.device}; batch: global {cfg.global_batch_size} = micro {cfg.micro_batch_size} x "
                f"accumulation {self.accum} x data-parallel {self.env.world_size}; {self.data.description}")
        for note in self.notes:
            c.print(f"  {note.message}")
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
        while self.step < until and not self.stop.agreed:
            launched = self.launch_step(on_micro)
            if pending is not None:
                yield self.finish_step(pending)
            pending = launched
            if self.syncs_after(self.step) or self.step == until or self.stop.agreed:
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
        loss, stop = distributed.mean_across(torch.stack([loss_sum / self.accum, self.stop.flag(self.device)]), env)
        done = time.perf_counter() if began is None else None
        return LaunchedStep(self.step, *copy_to_host(torch.stack([loss.float(), norm.to(loss.device).float(), stop])), lr,
                            t0, began, overlapped, done)

    def finish_step(self, launched: LaunchedStep) -> dict:
        """Read a launched step's loss (waiting for it) and make its record; a non-finite loss stops the run."""
        cfg = self.cfg
        if launched.ready is not None:
            launched.ready.synchronize()  # this step's work only: the step queued after it runs on
        loss, norm, stop = launched.values.tolist()
        self.stop.read(stop)
        elapsed = self.clock.seconds(launched)
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

    def save(self) -> Path | None:
        if self.env.is_main:
            checkpoint.begin(self.ckpt_root, self.step)
        distributed.barrier(self.env)
        tmp = checkpoint.staging_dir(self.ckpt_root, self.step)
        try:
            return self.write_checkpoint(tmp)
        except BaseException:
            if self.env.is_main:  # a failed save (a full disk) leaves the older checkpoints and nothing else
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def write_checkpoint(self, tmp: Path) -> Path | None:
        self.engine.save_collective(tmp)
        checkpoint.write_rank_files(tmp, self.env.rank, checkpoint.capture_rng())
        if self.env.is_main:
            model_state, optim_state, extra = self.engine.state()
            trainer_state = {
                "step": self.step, "consumed_samples": self.consumed, **extra,
                "model_shape": self.model.cfg.shape(), "model_config": vars(self.model.cfg).copy(),
                "config": self.cfg.to_dict(), "tokenizer": vars(self.tokenizer).copy(),
                "deepspeed": self.ds_config is not None, "fsdp": bool(self.opts.fsdp), "world_size": self.env.world_size,
            }
            checkpoint.write_main_files(tmp, self.step, model_state, optim_state, trainer_state)
        distributed.barrier(self.env)
        final = checkpoint.commit(self.ckpt_root, self.step, self.cfg.keep_last) if self.env.is_main else None
        distributed.barrier(self.env)
        return final

    def run(self) -> RunResult:
        self.lock = None
        try:
            self.preflight()
            self.setup()
            try:
                return self.loop()
            finally:
                self.close()
        finally:
            if self.lock is not None:
                self.lock.release()

    def close(self) -> None:
        if self.env.is_main:
            self.metrics.close()
        self.engine = None  # before the process group: freed by DDP's reducer, gloo's group can deadlock on the GIL
        gc.collect()
        distributed.shutdown(self.env)

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
            with self.stop:
                for record in self.steps(cfg.train_iters, bar.advance):
                    self.take_record(record, result, bar, main)
                if self.stop.agreed and self.step < cfg.train_iters:
                    result.stopped_at = self.step
                    if self.step % cfg.save_interval:  # else take_record has saved it
                        self.save()
        if main:
            result.metrics = self.metrics.path
            result.tensorboard = self.run_dir / "tensorboard"
            result.plot = self.metrics.plot(f"{self.opts.config_name}: loss")
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
                self.console.print(step_line(record, cfg.train_iters))
        if not self.syncs_after(record["step"]):
            return  # the next step is already queued: evaluations and checkpoints wait for the steps they follow
        if self.step % cfg.eval_interval == 0 or self.step == cfg.train_iters:
            result.final_val_loss = self.evaluate(bar.validation(cfg.eval_iters * self.accum))
            if main:
                self.metrics.write({"kind": "eval", "step": self.step, "loss": result.final_val_loss})
                self.console.print(f"step {self.step:>6}/{cfg.train_iters} | validation loss {result.final_val_loss:.4f}")
                result.plot = self.metrics.plot(f"{self.opts.config_name}: loss")  # at every evaluation: an interrupted run has one too
        if self.step % cfg.save_interval == 0 or self.step == cfg.train_iters:
            result.last_checkpoint = self.save()


def train(cfg: TrainConfig, opts: RunOptions, data: datamod.DataSetup | None = None, console=None) -> RunResult:
    with sizes.out_of_memory_is_one_line():
        return Trainer(cfg, opts, data, console).run()
