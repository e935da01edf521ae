"""GPU inventory and utilisation: NVML when the machine has GPUs, else the config's simulated GPUs (design §1).

Both paths produce the same :class:`GpuInfo` records, so everything after inventory is the same code.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

from nodeagent.config import SimulatedGpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str
    uuid: str
    vram_gb: float
    capability: float
    driver_version: str
    cuda_version: str
    simulated: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_inventory() -> list[GpuInfo]:
    """The machine's GPUs through NVML; empty when there is no driver or no GPU."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        cuda = ""
        with contextlib.suppress(Exception):
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            out.append(
                GpuInfo(
                    index=i,
                    model=_text(nv.nvmlDeviceGetName(h)),
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    vram_gb=round(nv.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
                    capability=float(f"{major}.{minor}"),
                    driver_version=driver,
                    cuda_version=cuda,
                    simulated=False,
                )
            )
    except Exception as exc:
        log.warning("NVML inventory failed: %s", exc)
        return []
    return out


def simulated_inventory(gpus: tuple[SimulatedGpu, ...], node_tag: str) -> list[GpuInfo]:
    return [
        GpuInfo(i, g.model, f"SIM-{node_tag}-{i}", g.vram_gb, g.capability, "sim", "sim", True)
        for i, g in enumerate(gpus)
    ]


def inventory(simulate: tuple[SimulatedGpu, ...], node_tag: str) -> list[GpuInfo]:
    """NVML GPUs if any, else the simulated ones from the config."""
    real = nvml_inventory()
    return real if real else simulated_inventory(simulate, node_tag)


def utilisation(gpus: list[GpuInfo], busy_indices: set[int]) -> list[float]:
    """Per-GPU utilisation in percent: NVML for real GPUs; a simulated GPU is 100 while a job holds it."""
    if gpus and not gpus[0].simulated:
        nv = _nvml()
        if nv is not None:
            with contextlib.suppress(Exception):
                return [float(nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(g.index)).gpu)
                        for g in gpus]
    return [100.0 if g.index in busy_indices else 0.0 for g in gpus]
