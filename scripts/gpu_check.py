"""``make gpu-check`` (design §17.7): what no test on a machine without a GPU can exercise, in one script.

On a machine with an NVIDIA GPU it runs three checks, each printing what it found:

1. **Inventory as the agent reads it**: ``nodeagent.inventory.nvml_inventory`` (model, UUID, VRAM, compute
   capability, driver and CUDA versions) and the owner-activity probe ``NvmlProbe`` (MIG mode and instances, the
   processes on each GPU with their memory, utilisation), then ``gpu_activity`` with no job processes.
2. **A CUDA PyTorch job checkpointed and restored bitwise through jobkit**: a small model trained on the GPU with
   deterministic kernels, checkpointed mid-run by ``TrainingState`` into a ``jobkit.Checkpointer``; a fresh model
   restored from that checkpoint continues to the same step, and every parameter and optimizer tensor is compared
   bit for bit with the uninterrupted run.
3. **bench-ckpt on CUDA**: ``scripts/bench_ckpt.py --device cuda`` (the device-to-host copy stall of an
   asynchronous snapshot against a synchronous save of ~1 GB of training state).

Without a GPU (NVML does not initialise or sees no device) it says so in one line and exits 0. Exit 1 when a
check fails. The last line: ``gpu-check: N GPU(s) MODEL, MIG M, inventory ok, resume bitwise ok|FAILED,
bench-ckpt sync X s / async Y s``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodeagent import inventory  # noqa: E402

RESUME_STEPS = 40  # steps of the bitwise check; the checkpoint is taken at half of them
BENCH_TIMEOUT_S = 360  # bench-ckpt's share of the script's 8 minutes


def no_gpu_reason() -> str | None:
    """Why there is nothing to check here (None when NVML sees at least one GPU)."""
    nv = inventory._nvml()
    if nv is None:
        return "NVML did not initialise: no NVIDIA driver"
    try:
        count = int(nv.nvmlDeviceGetCount())
    except Exception as exc:
        return f"NVML could not count devices ({exc})"
    return None if count > 0 else "NVML sees no device"


def check_inventory() -> tuple[list[inventory.GpuInfo], list[bool | None]]:
    """Check 1: the agent's inventory and owner-activity probe, printed per GPU."""
    gpus = inventory.nvml_inventory()
    if not gpus:
        raise RuntimeError("nvml_inventory() returned no GPU although NVML counts one")
    probe = inventory.NvmlProbe(inventory._nvml())
    mig = []
    for g in gpus:
        mode = probe.mig_mode(g.index)
        mig.append(mode)
        procs = probe.processes(g.index)
        print(f"inventory: GPU {g.index} {g.model} {g.vram_gb} GB, capability {g.capability}, driver "
              f"{g.driver_version}, CUDA {g.cuda_version}, MIG {mode}, {len(probe.mig_instances(g.index))} MIG "
              f"instances, {len(procs)} processes {procs[:5]}, utilisation {probe.utilisation(g.index):.0f}%")
    for act in inventory.gpu_activity(probe, set()):
        print(f"owner activity (no job processes): {act}")
    return gpus, mig


def _train(ts: Any, model: Any, steps: range, x: Any, y: Any) -> None:
    import torch

    for _ in steps:
        loss = torch.nn.functional.mse_loss(model(x), y)
        ts.optimizer.zero_grad()
        loss.backward()
        ts.optimizer.step()


def _state(device: str) -> tuple[Any, Any]:
    import torch

    from nodeagent.jobkit_torch import TrainingState

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return TrainingState(model, optimizer, async_snapshot=False), model


def check_resume_bitwise(device: str = "cuda") -> bool:
    """Check 2: interrupted-and-restored equals uninterrupted, bit for bit, on ``device``."""
    import torch

    from nodeagent import jobkit
    from nodeagent.jobkit_torch import make_deterministic, seed_everything

    make_deterministic()
    half = RESUME_STEPS // 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        seed_everything(0)
        ts, model = _state(device)
        g = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(256, 64, device=device, generator=g)
        y = torch.randn(256, 8, device=device, generator=g)
        ck = jobkit.Checkpointer(Path(tmp), install_signals=False)
        _train(ts, model, range(half), x, y)
        ts.checkpoint(ck, half)
        _train(ts, model, range(half, RESUME_STEPS), x, y)
        straight = {k: v.detach().clone() for k, v in model.state_dict().items()}

        seed_everything(12345)  # a different start: only the checkpoint may bring the run back
        ts2, model2 = _state(device)
        step = ts2.restore(jobkit.Checkpointer(Path(tmp), install_signals=False))
        if step != half:
            print(f"resume: restored step {step}, expected {half}")
            return False
        _train(ts2, model2, range(half, RESUME_STEPS), x, y)
        resumed = model2.state_dict()
    different = [k for k, v in straight.items() if not torch.equal(v, resumed[k])]
    print(f"resume: {RESUME_STEPS} steps on {device}, checkpoint at {half}; tensors differing: {different or 'none'}")
    return not different


def run_bench_ckpt() -> str:
    """Check 3: bench-ckpt on CUDA; its last line."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_ckpt.py"), "--device", "cuda"],
                         capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False)
    print(out.stdout, end="")
    if out.returncode != 0:
        print(out.stderr, end="", file=sys.stderr)
        return f"bench-ckpt FAILED (exit {out.returncode})"
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "bench-ckpt: no output"
    return last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-bench", action="store_true", help="checks 1 and 2 only")
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason is not None:
        print(f"gpu-check: no NVIDIA GPU on this machine ({reason}); nothing to check")
        return 0
    gpus, mig = check_inventory()
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: NVML sees {len(gpus)} GPU(s) but torch {torch.__version__} has no CUDA (a CPU build?): "
              "install a CUDA build of the torch extra to run checks 2 and 3")
        return 1
    bitwise = check_resume_bitwise("cuda")
    bench = "bench-ckpt skipped" if args.skip_bench else run_bench_ckpt()
    print(f"gpu-check: {len(gpus)} GPU(s) {gpus[0].model}, MIG {mig}, inventory ok, resume bitwise "
          f"{'ok' if bitwise else 'FAILED'}, {bench}")
    return 0 if bitwise and "FAILED" not in bench else 1


if __name__ == "__main__":
    sys.exit(main())
