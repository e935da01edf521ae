"""GPU inventory and utilisation: NVML when the machine has GPUs, else the config's simulated GPUs (design §1).

Both paths produce the same :class:`GpuInfo` records, so everything after inventory is the same code.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

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
    return utilisation_source(gpus).per_gpu(gpus, {i: 100.0 for i in busy_indices})


class UtilisationSource(Protocol):
    """Where per-GPU utilisation comes from (design §15 idle watchdog): NVML on a machine with GPUs, the jobs'
    simulated load otherwise. Both answer the same call, so the heartbeat is the same code either way."""

    def per_gpu(self, gpus: list[GpuInfo], load_by_index: Mapping[int, float]) -> list[float]:
        """Utilisation in percent of each of ``gpus``; ``load_by_index`` is what the jobs holding them say
        their simulated load is (read only by the simulated source)."""
        ...


class NvmlUtilisation:
    """Real GPUs: NVML's utilisation rate of each device (falls back to the simulated load if NVML fails)."""

    def per_gpu(self, gpus: list[GpuInfo], load_by_index: Mapping[int, float]) -> list[float]:
        nv = _nvml()
        if nv is not None:
            with contextlib.suppress(Exception):
                return [float(nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(g.index)).gpu)
                        for g in gpus]
        return SimulatedUtilisation().per_gpu(gpus, load_by_index)


class SimulatedUtilisation:
    """Simulated GPUs: a GPU is as busy as the job holding it says its load is (0 when none holds it)."""

    def per_gpu(self, gpus: list[GpuInfo], load_by_index: Mapping[int, float]) -> list[float]:
        out = []
        for g in gpus:
            load = load_by_index.get(g.index, 0.0)
            out.append(min(100.0, max(0.0, float(load))) if math.isfinite(load) else 0.0)
        return out


def utilisation_source(gpus: list[GpuInfo]) -> UtilisationSource:
    """NVML for real GPUs, the simulated load for simulated ones."""
    return NvmlUtilisation() if gpus and not gpus[0].simulated else SimulatedUtilisation()


def job_utilisation(gpus: list[GpuInfo], per_gpu: list[float], job_gpus: Mapping[str, list[int]]) -> dict[str, float]:
    """Each job's utilisation in percent: the mean over the GPUs it holds (jobs holding none are left out)."""
    by_index = {g.index: u for g, u in zip(gpus, per_gpu, strict=False)}
    out = {}
    for job_id, indices in job_gpus.items():
        values = [by_index[i] for i in indices if i in by_index and math.isfinite(by_index[i])]
        if values:
            out[job_id] = round(min(100.0, max(0.0, sum(values) / len(values))), 1)
    return out
