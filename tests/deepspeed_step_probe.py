"""Run by test_deepspeed_waits_gpu.py on one GPU: gpt2-tiny under DeepSpeed ZeRO-2 (the packaged zero2.json, the
gradient clip lowered so that it scales every step), STEPS steps twice from the same weights and batches: with
DeepSpeed's optimizer step as released, then with train/deepspeed_waits.py's. Prints, as JSON, each run's losses,
gradient norms and the host's waits for the device (cudaStreamSynchronize) inside its optimizer steps."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
from torch.profiler import ProfilerActivity, profile

STEPS = 6


def run(waits_stopped: bool) -> dict:
    import deepspeed

    from gptforge.model.gpt import GPT
    from gptforge.train.config import load_config
    from gptforge.train.deepspeed_engine import read_deepspeed_config
    from gptforge.train.deepspeed_waits import stop_host_waits
    from gptforge.train.optim import param_groups

    cfg, _ = load_config("gpt2-tiny", ["micro-batch-size=4", "global-batch-size=4"])
    ds = read_deepspeed_config("zero2", cfg, world_size=1)
    ds["gradient_clipping"] = 1e-3
    torch.manual_seed(0)
    model = GPT(cfg.model_config(512)).cuda()
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
    applied = stop_host_waits(zero) if waits_stopped else False
    batches = torch.randint(0, 512, (STEPS, 4, cfg.seq_length + 1), generator=torch.Generator().manual_seed(1)).cuda()
    losses, norms, waits = [], [], 0
    for batch in batches:
        _, loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.step()
        waits += sum(e.name == "cudaStreamSynchronize" for e in prof.events())
        losses.append(loss.float().item())
        norms.append(float(engine.get_global_grad_norm()))
    return {"applied": applied, "losses": losses, "norms": norms, "waits": waits}


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed

    deepspeed.init_distributed("nccl")
    released = run(waits_stopped=False)  # first: stop_host_waits changes DeepSpeed's module for the process
    print(json.dumps({"released": released, "stopped": run(waits_stopped=True)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
