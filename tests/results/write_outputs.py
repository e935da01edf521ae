"""A job that writes results (design §14 tests): deterministic files under its output directory and one
checkpoint, then exits 0. ``expected_outputs`` gives the same bytes to compare with what the portal serves.

    python tests/results/write_outputs.py --out out --seed 7 --big-bytes 3000000
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing
import numpy as np

from nodeagent import jobkit


def expected_outputs(seed: int, big_bytes: int) -> dict[str, bytes]:
    """The files the job writes, by path relative to its output directory."""
    big = np.random.default_rng(seed).integers(0, 256, size=big_bytes, dtype=np.uint8).tobytes()
    return {
        "metrics.json": b'{"loss": 0.125, "seed": %d}\n' % seed,
        "sub/dir/weights.bin": big,
        "name with spaces #1.txt": "ünïcode and spaces\n".encode(),
        "empty.txt": b"",
        "digest.txt": hashlib.sha256(big).hexdigest().encode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--big-bytes", type=int, default=100_000)
    args = parser.parse_args()
    out = Path(args.out)
    for rel, data in expected_outputs(args.seed, args.big_bytes).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        jobkit.atomic_write_bytes(path, data)
    (Path("outside.txt")).write_text("not in the output directory\n")
    ckpt = jobkit.Checkpointer.from_env()
    ckpt.checkpoint(10, {"w": np.arange(1000, dtype=np.float64)}, final=False)
    ckpt.report_progress(10, min_period_s=0)
    print("results written", flush=True)


if __name__ == "__main__":
    main()
