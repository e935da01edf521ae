"""``make bench-ckpt`` (design §2 "Asynchronous snapshots", §17.6): what a 1 GB PyTorch checkpoint costs the
training loop, synchronous against asynchronous snapshot.

A model of 5 × Linear(4096, 4096) (84 M float32 parameters) with its Adam state (two moments per parameter) is
about 1 GB of training state. Each repetition takes one synchronous checkpoint (``Checkpointer.checkpoint``:
torch.save, write, fsync, rename, sha256, manifest — the loop waits for all of it) and one asynchronous one
(``checkpoint_async``: the loop waits only for the copy to host memory; the rest runs in a background thread),
both through jobkit into a temporary directory on disk. While the background write runs, a small CPU training
loop (an MLP on random batches) counts its steps; the same loop on an idle machine gives the reference rate.
Medians over the repetitions. Last line:
``bench-ckpt: sync stall X s, async stall Y s, ratio R``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from nodeagent import jobkit  # noqa: E402
from nodeagent.jobkit_torch import STATE_KEY, TrainingState  # noqa: E402

WIDTH = 4096
LAYERS = 5  # 5 × 4096² weights (+ biases) ≈ 84 M parameters; × 3 (weights, Adam exp_avg, exp_avg_sq) ≈ 1.0 GB


def big_state(device: str = "cpu") -> TrainingState:
    """~1 GB of training state on ``device``: the model and Adam's two moments (materialised by one step on zero
    gradients). On ``cuda`` the asynchronous snapshot's stall is the device-to-host copy (``make gpu-check``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return TrainingState(model, optimizer)


def state_bytes(ts: TrainingState) -> int:
    total = sum(p.numel() * p.element_size() for p in ts.model.parameters())
    for st in ts.optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in st.values() if isinstance(v, torch.Tensor))
    return total


class SmallLoop:
    """A small CPU training loop whose steps/s shows what the background write costs the job."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(64, 256, generator=g)
        self.y = torch.randint(0, 10, (64,), generator=g)

    def step(self) -> None:
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def rate_for(self, seconds: float) -> float:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            self.step()
            n += 1
        return n / (time.perf_counter() - t0)

    def rate_while(self, ck: jobkit.Checkpointer) -> tuple[float, int]:
        """Steps/s while ``ck``'s background write runs (and how many steps ran meanwhile)."""
        t0, n = time.perf_counter(), 0
        while ck.writing():
            self.step()
            n += 1
        return n / max(time.perf_counter() - t0, 1e-9), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory under /var/tmp)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the training state lives (cuda: make gpu-check); the small loop runs on the CPU")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device cuda: torch {torch.__version__} sees no CUDA device")
    torch.set_num_threads(1)
    ts = big_state(args.device)
    size = state_bytes(ts)
    print(f"state: {size / 1e9:.2f} GB on {args.device} ({LAYERS} x Linear({WIDTH}, {WIDTH}) + Adam moments)")
    base = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir or "/var/tmp"))
    loop = SmallLoop()
    loop.rate_for(0.5)  # warm up
    sync_stall, async_stall, async_write, busy_rate, idle_rate = [], [], [], [], []
    try:
        ck = jobkit.Checkpointer(base, install_signals=False, keep_last=1)
        for rep in range(1, args.reps + 1):
            t0 = time.perf_counter()
            m = ck.checkpoint(2 * rep - 1, {STATE_KEY: ts})
            sync_stall.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert ck.checkpoint_async(2 * rep, {STATE_KEY: ts})
            async_stall.append(time.perf_counter() - t0)
            rate, steps = loop.rate_while(ck)
            ck.wait()
            a = ck.last_manifest
            assert a is not None and a.mode == "async" and jobkit.verify(base, a)
            async_write.append(a.write_s or 0.0)
            busy_rate.append(rate)
            idle_rate.append(loop.rate_for(max(a.write_s or 1.0, 1.0)))
            print(f"rep {rep}: sync stall {sync_stall[-1]:.3f} s (file {m.size_bytes / 1e9:.2f} GB) | async stall "
                  f"{async_stall[-1]:.3f} s, background write {async_write[-1]:.2f} s, {steps} steps meanwhile | "
                  f"small loop {rate:.0f} steps/s during the write, {idle_rate[-1]:.0f} steps/s idle")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    s, a = statistics.median(sync_stall), statistics.median(async_stall)
    busy, idle = statistics.median(busy_rate), statistics.median(idle_rate)
    print(f"medians over {args.reps}: background write {statistics.median(async_write):.2f} s; training "
          f"throughput during it {busy:.0f} steps/s vs {idle:.0f} idle ({busy / idle:.0%})")
    print(f"bench-ckpt: sync stall {s:.3f} s, async stall {a:.3f} s, ratio {s / a:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
