"""GPU inventory and utilisation: NVML when the machine has GPUs, else the config's simulated GPUs (design §1).

Both paths produce the same :class:`GpuInfo` records, so everything after inventory is the same code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
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


# --- Owner activity and MIG (design §1 "Owner activity and MIG") ---------------------------------------------------
# Which processes use each GPU, and its MIG layout, so that a provider's own use of a lent GPU is seen (HTCondor's
# owner activity). NVML on a machine with GPUs; a recorded inventory (JSON, the same calls' answers) otherwise.

MAX_REPORTED_PIDS = 16  # per GPU: a heartbeat names at most this many foreign PIDs (the count and memory are whole)
MAX_MIG_INSTANCES = 7  # an A100/H100 has at most 7 GPU instances


@dataclass(frozen=True)
class ProbeDevice:
    """One physical GPU as a probe sees it."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (a GPU instance's compute slice) of a physical GPU."""

    uuid: str
    memory_total_bytes: int


class GpuProbe(Protocol):
    """The few NVML questions owner-activity detection asks. :class:`NvmlProbe` asks NVML; :class:`RecordedProbe`
    answers from a recorded inventory, so everything after the probe is the same code (design §1)."""

    def devices(self) -> list[ProbeDevice]:
        """The physical GPUs."""
        ...

    def mig_mode(self, index: int) -> bool | None:
        """Whether MIG is enabled on GPU ``index`` (its current mode); None when the GPU has no MIG support."""
        ...

    def mig_instances(self, index: int) -> list[MigInstance]:
        """The MIG devices of GPU ``index`` ([] when MIG is off)."""
        ...

    def processes(self, index: int) -> list[tuple[int, int]]:
        """(pid, used GPU memory in bytes) of every compute and graphics process on GPU ``index`` (and its MIG
        devices); a process whose memory NVML cannot tell counts 0 bytes."""
        ...

    def utilisation(self, index: int) -> float:
        """GPU ``index``'s utilisation in percent."""
        ...


class NvmlProbe:
    """The real probe: pynvml (``nvidia-ml-py``). Each call reopens nothing: ``nvmlInit`` is reference-counted and
    cheap after the first; a failing call answers "nothing" rather than raising."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv

    def _handle(self, index: int) -> Any:
        return self.nv.nvmlDeviceGetHandleByIndex(index)

    def devices(self) -> list[ProbeDevice]:
        out = []
        with contextlib.suppress(Exception):
            for i in range(self.nv.nvmlDeviceGetCount()):
                h = self._handle(i)
                out.append(ProbeDevice(i, _text(self.nv.nvmlDeviceGetUUID(h)), _text(self.nv.nvmlDeviceGetName(h)),
                                       int(self.nv.nvmlDeviceGetMemoryInfo(h).total)))
        return out

    def mig_mode(self, index: int) -> bool | None:
        try:
            current, _pending = self.nv.nvmlDeviceGetMigMode(self._handle(index))
        except Exception:  # NVMLError_NotSupported: a GPU without MIG
            return None
        return int(current) == self.nv.NVML_DEVICE_MIG_ENABLE

    def _mig_handles(self, index: int) -> list[Any]:
        if not self.mig_mode(index):
            return []
        parent = self._handle(index)
        handles = []
        try:
            count = int(self.nv.nvmlDeviceGetMaxMigDeviceCount(parent))
        except Exception:
            return []
        for k in range(count):
            try:
                handles.append(self.nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, k))
            except Exception:  # NVMLError_NotFound: no MIG device at this slot
                continue
        return handles

    def mig_instances(self, index: int) -> list[MigInstance]:
        out = []
        for h in self._mig_handles(index):
            with contextlib.suppress(Exception):
                out.append(MigInstance(_text(self.nv.nvmlDeviceGetUUID(h)),
                                       int(self.nv.nvmlDeviceGetMemoryInfo(h).total)))
        return out

    def processes(self, index: int) -> list[tuple[int, int]]:
        used: dict[int, int] = {}
        for h in [self._handle(index), *self._mig_handles(index)]:
            for call in (self.nv.nvmlDeviceGetComputeRunningProcesses, self.nv.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    procs = call(h)
                except Exception:  # NVMLError_NoPermission (MIG needs root), NotSupported …
                    continue
                for p in procs:
                    used[int(p.pid)] = max(used.get(int(p.pid), 0), int(p.usedGpuMemory or 0))
        return sorted(used.items())

    def utilisation(self, index: int) -> float:
        try:
            return float(self.nv.nvmlDeviceGetUtilizationRates(self._handle(index)).gpu)
        except Exception:  # MIG mode: utilisation is not reported per physical GPU
            return 0.0


class RecordedProbe:
    """A recorded inventory: what NVML answered on some machine, as JSON (``tests/nvml/*.json``; design §1). The
    same questions as :class:`NvmlProbe`, answered from the record, for machines without a GPU and for tests.

    ``{"devices": [{"index", "uuid", "name", "memory_total_bytes", "mig_mode": true|false|null,
    "mig_instances": [{"uuid", "memory_total_bytes"}], "processes": [{"pid", "used_memory_bytes"}],
    "utilisation_pct"}]}``"""

    def __init__(self, record: Mapping[str, Any]) -> None:
        devices = record.get("devices")
        if not isinstance(devices, list):
            raise ValueError("recorded inventory: 'devices' must be a list")
        self.record = {int(d["index"]): d for d in devices}

    @classmethod
    def from_file(cls, path: str | Path) -> RecordedProbe:
        return cls(json.loads(Path(path).read_text()))

    def devices(self) -> list[ProbeDevice]:
        return [ProbeDevice(i, str(d["uuid"]), str(d["name"]), int(d["memory_total_bytes"]))
                for i, d in sorted(self.record.items())]

    def mig_mode(self, index: int) -> bool | None:
        mode = self.record[index].get("mig_mode")
        return None if mode is None else bool(mode)

    def mig_instances(self, index: int) -> list[MigInstance]:
        if not self.mig_mode(index):
            return []
        return [MigInstance(str(m["uuid"]), int(m["memory_total_bytes"]))
                for m in self.record[index].get("mig_instances", [])]

    def processes(self, index: int) -> list[tuple[int, int]]:
        return sorted((int(p["pid"]), int(p.get("used_memory_bytes") or 0))
                      for p in self.record[index].get("processes", []))

    def utilisation(self, index: int) -> float:
        return float(self.record[index].get("utilisation_pct", 0.0))


def _stat(pid: int, proc_root: Path) -> tuple[int, int, int] | None:
    """(parent pid, process group, session) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session …
    try:
        return int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def owned_by_jobs(pid: int, job_pids: set[int], proc_root: Path = Path("/proc")) -> bool | None:
    """Whether ``pid`` is one of the agent's jobs' processes: a job's process itself, one in its process group or
    session (the runner starts each job as a session leader), or a descendant of one (walking the parent chain,
    so a worker that called ``setsid`` still counts). None when ``pid`` is not visible here (it exited, or it
    lives in another PID namespace: design §1 "Owner activity and MIG" on containers)."""
    seen = 0
    current = pid
    first = True
    while current > 1 and seen < 64:
        if current in job_pids:
            return True
        stat = _stat(current, proc_root)
        if stat is None:
            return None if first else False
        ppid, pgrp, session = stat
        if pgrp in job_pids or session in job_pids:
            return True
        current, first, seen = ppid, False, seen + 1
    return False


@dataclass(frozen=True)
class GpuActivity:
    """One GPU's MIG layout and who uses it, as a heartbeat reports it (``gpu_state``; design §1)."""

    index: int
    mig_mode: str  # "enabled", "disabled", or "" when the GPU has no MIG
    mig_instances: tuple[MigInstance, ...]
    foreign_pids: tuple[int, ...]  # processes that are none of the agent's jobs'
    foreign_memory_bytes: int
    own_process_count: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "mig_mode": self.mig_mode,
            "mig_instances": [{"uuid": m.uuid[:64], "memory_bytes": m.memory_total_bytes}
                              for m in self.mig_instances[:MAX_MIG_INSTANCES]],
            "foreign_processes": {"count": len(self.foreign_pids), "memory_bytes": self.foreign_memory_bytes,
                                  "pids": list(self.foreign_pids[:MAX_REPORTED_PIDS])},
        }


def gpu_activity(probe: GpuProbe, job_pids: set[int], proc_root: Path = Path("/proc")) -> list[GpuActivity]:
    """Each GPU's MIG mode and instances, and its processes split into the agent's jobs' and foreign ones (owner
    use, design §1). A PID not visible in ``proc_root`` (exited since NVML listed it) is left out."""
    out = []
    for dev in probe.devices():
        mode = probe.mig_mode(dev.index)
        foreign: list[tuple[int, int]] = []
        own = 0
        for pid, used_bytes in probe.processes(dev.index):
            mine = owned_by_jobs(pid, job_pids, proc_root)
            if mine is None:
                continue
            if mine:
                own += 1
            else:
                foreign.append((pid, max(0, used_bytes)))
        out.append(GpuActivity(
            index=dev.index, mig_mode="" if mode is None else ("enabled" if mode else "disabled"),
            mig_instances=tuple(probe.mig_instances(dev.index)), foreign_pids=tuple(p for p, _ in foreign),
            foreign_memory_bytes=sum(b for _, b in foreign), own_process_count=own))
    return out


RECORDING_ENV = "RECLAIMNET_AGENT_GPU_RECORDING"  # a recorded inventory the agent reports as its GPUs' activity


def gpu_probe(gpus: list[GpuInfo]) -> GpuProbe | None:
    """NVML for real GPUs; for simulated ones the recorded inventory named by ``RECLAIMNET_AGENT_GPU_RECORDING``
    if set (demos, end-to-end tests), else None (no activity is reported)."""
    if gpus and not gpus[0].simulated:
        nv = _nvml()
        return NvmlProbe(nv) if nv is not None else None
    path = os.environ.get(RECORDING_ENV)
    if not path:
        return None
    try:
        return RecordedProbe.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s=%s: not a recorded inventory (%s)", RECORDING_ENV, path, exc)
        return None


_probes: dict[tuple[str, ...], GpuProbe | None] = {}


def gpu_state_field(gpus: list[GpuInfo], job_pids: Callable[[], set[int]]) -> dict[str, Any]:
    """``{"gpu_state": [...]}`` for a hello or heartbeat (design §1 "Owner activity and MIG"), or ``{}`` when
    there is no probe for these GPUs or it failed. The probe is chosen once per inventory; ``job_pids`` (it reads
    the jobs' cgroups) is asked only when there is one."""
    key = tuple(g.uuid for g in gpus)
    if key not in _probes:
        _probes[key] = gpu_probe(gpus)
    probe = _probes[key]
    if probe is None:
        return {}
    try:
        return {"gpu_state": [a.as_dict() for a in gpu_activity(probe, job_pids())]}
    except Exception as exc:  # a probe must never cost the agent its heartbeat
        log.warning("GPU activity probe failed: %s", exc)
        return {}
