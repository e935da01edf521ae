"""``gpu_state`` of a hello or heartbeat: each GPU's MIG layout and the processes on it that are none of the
agent's jobs' (design §1 "Owner activity and MIG"). Checked here at the portal's boundary, every field named in
the refusal; :mod:`portal.control.owner_use` acts on it.

``gpu_state``: ``[{"index": int, "mig_mode": "enabled"|"disabled"|"", "mig_instances": [{"uuid": str,
"memory_bytes": int}], "foreign_processes": {"count": int, "memory_bytes": int, "pids": [int]}}]``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypedDict

MAX_GPUS = 64
MAX_MIG_INSTANCES = 7  # the most GPU instances an NVIDIA GPU offers (A100/H100)
MAX_PIDS = 16  # the agent names at most 16 foreign PIDs per GPU; the count and memory cover all of them
MAX_PROCESS_COUNT = 1 << 20
MAX_MEMORY_BYTES = 1 << 44  # 16 TiB: above any GPU's memory
MAX_PID = 1 << 22  # Linux's pid_max limit
MIG_MODES = ("enabled", "disabled", "")


class MigInstanceState(TypedDict):
    uuid: str
    memory_bytes: int


class ForeignProcesses(TypedDict):
    count: int
    memory_bytes: int
    pids: list[int]


class GpuState(TypedDict):
    index: int
    mig_mode: Literal["enabled", "disabled", ""]
    mig_instances: list[MigInstanceState]
    foreign_processes: ForeignProcesses


class GpuStateError(ValueError):
    """``gpu_state`` is malformed; the message names the field (``heartbeat.gpu_state[1].foreign_processes.count``)."""


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise GpuStateError(f"{field}: not a finite number")
    if not isinstance(value, int) or isinstance(value, bool):
        raise GpuStateError(f"{field}: not an integer")
    if not low <= value <= high:
        raise GpuStateError(f"{field}: out of range {low}..{high}")
    return value


def check_gpu_state(kind: str, items: Any) -> list[GpuState]:
    """``items`` as well-formed :class:`GpuState` records, or :class:`GpuStateError` naming the first bad field.
    Counts and sizes are non-negative integers (NaN, infinities, negatives and booleans are refused); at most one
    record per GPU index."""
    name = f"{kind}.gpu_state"
    if not isinstance(items, list) or len(items) > MAX_GPUS:
        raise GpuStateError(f"{name}: a list of at most {MAX_GPUS} GPUs")
    out: list[GpuState] = []
    seen: set[int] = set()
    for i, item in enumerate(items):
        at = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise GpuStateError(f"{at}: not an object")
        index = _int(item.get("index"), f"{at}.index", 0, MAX_GPUS - 1)
        if index in seen:
            raise GpuStateError(f"{at}.index: GPU {index} listed twice")
        seen.add(index)
        mode = item.get("mig_mode", "")
        if mode not in MIG_MODES:
            raise GpuStateError(f"{at}.mig_mode: one of enabled, disabled or empty")
        instances = item.get("mig_instances", [])
        if not isinstance(instances, list) or len(instances) > MAX_MIG_INSTANCES:
            raise GpuStateError(f"{at}.mig_instances: a list of at most {MAX_MIG_INSTANCES}")
        if instances and mode != "enabled":
            raise GpuStateError(f"{at}.mig_instances: listed while mig_mode is not enabled")
        migs: list[MigInstanceState] = []
        for k, m in enumerate(instances):
            if not isinstance(m, dict):
                raise GpuStateError(f"{at}.mig_instances[{k}]: not an object")
            uuid = m.get("uuid")
            if not isinstance(uuid, str) or not 0 < len(uuid) <= 64:
                raise GpuStateError(f"{at}.mig_instances[{k}].uuid: 1-64 characters")
            migs.append({"uuid": uuid, "memory_bytes": _int(m.get("memory_bytes"),
                                                            f"{at}.mig_instances[{k}].memory_bytes",
                                                            0, MAX_MEMORY_BYTES)})
        foreign = item.get("foreign_processes")
        if not isinstance(foreign, dict):
            raise GpuStateError(f"{at}.foreign_processes: not an object")
        count = _int(foreign.get("count"), f"{at}.foreign_processes.count", 0, MAX_PROCESS_COUNT)
        memory = _int(foreign.get("memory_bytes"), f"{at}.foreign_processes.memory_bytes", 0, MAX_MEMORY_BYTES)
        pids = foreign.get("pids", [])
        if not isinstance(pids, list) or len(pids) > MAX_PIDS:
            raise GpuStateError(f"{at}.foreign_processes.pids: a list of at most {MAX_PIDS}")
        pids = [_int(p, f"{at}.foreign_processes.pids[{k}]", 1, MAX_PID) for k, p in enumerate(pids)]
        if len(pids) > count:
            raise GpuStateError(f"{at}.foreign_processes.pids: more PIDs than count")
        out.append({"index": index, "mig_mode": mode, "mig_instances": migs,
                    "foreign_processes": {"count": count, "memory_bytes": memory, "pids": pids}})
    return out
