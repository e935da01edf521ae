"""A small deterministic training job (numpy) that survives reclaims through ``nodeagent.jobkit``.

Linear regression by SGD on synthetic data. The minibatch of step ``s`` is drawn from a generator seeded by
(seed, s), so resuming from any checkpoint reproduces the uninterrupted run bit for bit (design §1: zero-loss
scheduled migration is checkable). At the end it writes ``result.json`` with the sha256 of the final weights.

    python examples/train_numpy.py --steps 300 --dim 256 --step-sleep 0.02
    RECLAIMNET_CKPT_DIR=/tmp/ck python examples/train_numpy.py --steps 50   # outside an agent
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from nodeagent import jobkit


def init_state(dim: int, seed: int, pad_bytes: int) -> dict[str, np.ndarray]:
    """Initial weights (and an optional padding array that makes the checkpoint bigger, for transfer tests)."""
    rng = np.random.default_rng(seed)
    state = {"w": rng.standard_normal(dim) * 0.01, "b": np.zeros(1)}
    if pad_bytes > 0:
        state["pad"] = rng.integers(0, 255, size=pad_bytes, dtype=np.uint8)
    return state


def train_step(state: dict[str, np.ndarray], step: int, seed: int, batch: int, lr: float) -> None:
    """One SGD step on the deterministic minibatch of ``step`` (in place)."""
    rng = np.random.default_rng([seed, step])
    dim = state["w"].shape[0]
    x = rng.standard_normal((batch, dim))
    true_w = np.sin(np.arange(dim, dtype=np.float64))
    y = x @ true_w + 0.1 * rng.standard_normal(batch)
    err = x @ state["w"] + state["b"][0] - y
    state["w"] -= lr * (x.T @ err) / batch
    state["b"] -= lr * np.array([err.mean()])


def weights_sha256(state: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in ("w", "b"):
        digest.update(np.ascontiguousarray(state[key]).tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend GPU work per step")
    parser.add_argument("--pad-bytes", type=int, default=0, help="extra checkpoint payload, bytes")
    parser.add_argument("--result", default=os.environ.get("RECLAIMNET_RESULT_FILE", "result.json"))
    args = parser.parse_args(argv)

    ck = jobkit.Checkpointer.from_env()
    restored = ck.restore()
    if restored is not None:
        step, state = restored
        print(f"restored step {step}", flush=True)
    else:
        step, state = 0, init_state(args.dim, args.seed, args.pad_bytes)
    while step < args.steps:
        train_step(state, step, args.seed, args.batch, args.lr)
        step += 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        ck.report_progress(step)
        if ck.maybe_checkpoint(step, lambda: state):
            print(f"final checkpoint at step {step}", flush=True)
            ck.exit_checkpointed()
    ck.report_progress(step, min_period_s=0.0)
    result = {"steps": step, "weights_sha256": weights_sha256(state)}
    Path(args.result).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
