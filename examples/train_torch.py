"""A small deterministic PyTorch job that survives reclaims through ``nodeagent.jobkit_torch`` (design §17).

A tiny MLP (with dropout) built from its config, never downloaded weights, on a synthetic regression set:
AdamW, a OneCycle LR schedule, an AMP GradScaler (on when the device supports it), a shuffling
:class:`ResumableSampler` and a step that draws from Python ``random``, numpy and torch's generators. Every one of
them is checkpointed, so a run stopped at any step and resumed (here or on another node) ends with the same
weights, bit for bit, as an uninterrupted one. At the end it writes ``final_weights.pt`` (the model's state_dict)
and ``result.json`` (steps, sha256 of the weights).

    python examples/train_torch.py --epochs 3 --step-sleep 0.02
    RECLAIMNET_CKPT_DIR=/tmp/ck python examples/train_torch.py     # outside an agent
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from nodeagent import jobkit
from nodeagent.jobkit_torch import ResumableSampler, TrainingState, make_deterministic, seed_everything


def build_model(dim_in: int, hidden: int, dropout: float) -> nn.Module:
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, hidden),
                         nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, 1))


def synthetic_dataset(samples: int, dim_in: int, seed: int) -> TensorDataset:
    """A fixed regression set drawn from its own generator (the same in every run with this seed)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim_in, generator=gen)
    true_w = torch.sin(torch.arange(dim_in, dtype=torch.float32)).unsqueeze(1)
    y = x @ true_w + 0.1 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend GPU work per step")
    parser.add_argument("--weights-out", default="final_weights.pt")
    parser.add_argument("--result", default=os.environ.get("RECLAIMNET_RESULT_FILE", "result.json"))
    args = parser.parse_args(argv)

    make_deterministic(threads=1)
    seed_everything(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = synthetic_dataset(args.samples, args.dim, args.seed)
    sampler = ResumableSampler(len(dataset), seed=args.seed)
    # The loader's own generator: each new iterator draws a base seed from it, never from the global torch RNG
    # (a resumed run creates one iterator more than an uninterrupted run, mid-epoch).
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler,
                        generator=torch.Generator().manual_seed(args.seed))
    model = build_model(args.dim, args.hidden, args.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps_per_epoch = -(-args.samples // args.batch)
    total_steps = args.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps)
    # On CPU the scaler is a no-op numerically (float32 gradients, power-of-two scale) but it runs and its scale
    # grows every 10 steps, so its state has to survive a checkpoint like the others.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8, growth_interval=10)
    training = TrainingState(model, optimizer, scheduler, scaler, sampler, extra={"loss_sum": 0.0})

    ck = jobkit.Checkpointer.from_env()
    step = training.restore(ck)
    if step:
        print(f"restored step {step} (epoch {sampler.epoch}, sample {sampler.consumed})", flush=True)
    model.train()
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            # Augmentation that draws from all three global generators, so each must be restored exactly.
            x = x * (1.0 + 0.01 * random.random()) + 0.01 * float(np.random.standard_normal())
            x = x + 0.01 * torch.randn(x.shape).to(device)
            with torch.autocast(device.type, enabled=device.type == "cuda"):
                loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            sampler.advance(len(x))
            training.extra["loss_sum"] += float(loss.detach())
            step += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
            ck.report_progress(step)
            if training.maybe_checkpoint(ck, step):
                print(f"final checkpoint at step {step}", flush=True)
                ck.exit_checkpointed()
    ck.report_progress(step, min_period_s=0.0)
    torch.save(model.state_dict(), args.weights_out)
    result = {"steps": step, "weights_sha256": weights_sha256(model), "scale": scaler.get_scale(),
              "loss_sum": training.extra["loss_sum"]}
    Path(args.result).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
