"""The agent's GPU activity from recorded NVML inventories (design §1 "Owner activity and MIG"): MIG instances
listed, processes split into the agent's jobs' and foreign ones on a real ``/proc``, and the real NVML probe's
calls checked against pynvml itself."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodeagent.config import SimulatedGpu
from nodeagent.inventory import (
    RECORDING_ENV,
    NvmlProbe,
    RecordedProbe,
    gpu_activity,
    gpu_state_field,
    owned_by_jobs,
    simulated_inventory,
)
from portal.control.link.gpu_state import GpuStateError, check_gpu_state
from tests.nvml.recorded import HERE, load, processes, rebind


def test_rtx3090_owner_processes_are_foreign_and_the_jobs_own_processes_are_not() -> None:
    with processes(lab=2) as p:
        probe = RecordedProbe(rebind(load("rtx3090_owner.json"),
                                     {31337: p.job, 31338: p.worker, 52001: p.lab[0], 52002: p.lab[1], 2400: p.gone}))
        gpu0, gpu1 = gpu_activity(probe, {p.job})
    assert (gpu0.own_process_count, gpu0.foreign_pids, gpu0.foreign_memory_bytes) == (2, (), 0)
    # The lab's two processes (4 GiB + 768 MiB); the exited PID is left out.
    assert gpu1.foreign_pids == tuple(sorted(p.lab)) and gpu1.own_process_count == 0
    assert gpu1.foreign_memory_bytes == 4294967296 + 805306368
    assert gpu0.mig_mode == gpu1.mig_mode == "" and gpu1.mig_instances == ()
    report = gpu1.as_dict()
    assert report["foreign_processes"] == {"count": 2, "memory_bytes": 5100273664, "pids": sorted(p.lab)}
    # What the agent reports is what the portal accepts.
    assert check_gpu_state("heartbeat", [gpu0.as_dict(), report])[1]["foreign_processes"]["count"] == 2


def test_a100_with_mig_lists_its_three_instances_and_the_foreign_process_on_one() -> None:
    with processes(lab=1) as p:
        probe = RecordedProbe(rebind(load("a100_mig.json"), {31337: p.job, 40211: p.lab[0]}))
        (gpu,) = gpu_activity(probe, {p.job})
    assert gpu.mig_mode == "enabled"
    assert [m.uuid for m in gpu.mig_instances] == ["MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d",
                                                   "MIG-1b2c3d4e-5f6a-5b7c-9d8e-0f1a2b3c4d5e",
                                                   "MIG-2c3d4e5f-6a7b-5c8d-8e9f-1a2b3c4d5e6f"]
    assert [m.memory_total_bytes for m in gpu.mig_instances] == [42481811456, 21072183296, 10468982784]
    assert (gpu.own_process_count, gpu.foreign_pids, gpu.foreign_memory_bytes) == (1, (p.lab[0],), 8589934592)
    assert check_gpu_state("hello", [gpu.as_dict()])[0]["mig_instances"][2]["memory_bytes"] == 10468982784


def test_process_ownership_follows_session_group_and_parent_chain() -> None:
    with processes(lab=1) as p:
        assert owned_by_jobs(p.job, {p.job}) is True
        assert owned_by_jobs(p.worker, {p.job}) is True  # left the session: still a child of the job
        assert owned_by_jobs(p.lab[0], {p.job}) is False
        assert owned_by_jobs(p.worker, set()) is False  # no jobs: everything is foreign
        assert owned_by_jobs(p.gone, {p.job}) is None  # not visible: neither


class FakeNvml:
    """pynvml's calls the NVML probe makes, answered from a recording (the machine has no GPU). Only names that
    pynvml really has are defined here (checked below), with pynvml's return shapes."""

    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, record: dict[str, Any]) -> None:
        self.devices = record["devices"]

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return ("gpu", i)

    def _dev(self, h: Any) -> dict[str, Any]:
        return self.devices[h[1]]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._dev(h)["mig_instances"][h[2]]["uuid"] if h[0] == "mig" else self._dev(h)["uuid"]

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._dev(h)["name"]

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        d = self._dev(h)
        total = d["mig_instances"][h[2]]["memory_total_bytes"] if h[0] == "mig" else d["memory_total_bytes"]
        return SimpleNamespace(total=total, used=0, free=total)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = self._dev(h)["mig_mode"]
        if mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [int(mode), int(mode)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, k: int) -> Any:
        if k >= len(self._dev(h).get("mig_instances", [])):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], k)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        # MIG: each process is listed on its MIG device and, for the parent, too (deduplicated by the probe)
        return [SimpleNamespace(pid=q["pid"], usedGpuMemory=q["used_memory_bytes"], gpuInstanceId=0,
                                computeInstanceId=0) for q in self._dev(h).get("processes", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return SimpleNamespace(gpu=self._dev(h)["utilisation_pct"], memory=0)


def test_the_fake_nvml_only_uses_names_pynvml_has() -> None:
    names = [n for n in vars(FakeNvml) if n.startswith(("nvml", "NVML"))]
    assert len(names) >= 11
    assert [n for n in names if not hasattr(pynvml, n)] == []


@pytest.mark.parametrize("name", ["a100_mig.json", "rtx3090_owner.json"])
def test_the_nvml_probe_answers_as_the_recording_does(name: str) -> None:
    record = load(name)
    real, recorded = NvmlProbe(FakeNvml(record)), RecordedProbe(record)
    assert real.devices() == recorded.devices()
    for dev in recorded.devices():
        i = dev.index
        assert real.mig_mode(i) == recorded.mig_mode(i)
        assert real.mig_instances(i) == recorded.mig_instances(i)
        assert real.processes(i) == recorded.processes(i)
        assert real.utilisation(i) == recorded.utilisation(i)


def test_simulated_gpus_report_a_recording_only_when_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    gpus = simulated_inventory((SimulatedGpu("RTX 3090", 24.0, 8.6),) * 2, "abc123")
    monkeypatch.delenv(RECORDING_ENV, raising=False)

    def never() -> set[int]:
        raise AssertionError("the jobs' cgroups were read for GPUs that report no activity")

    assert gpu_state_field(gpus, never) == {}  # no probe: no cgroup read on every heartbeat either
    path = tmp_path / "rec.json"
    path.write_text((HERE / "rtx3090_owner.json").read_text())
    monkeypatch.setenv(RECORDING_ENV, str(path))
    other = simulated_inventory((SimulatedGpu("RTX 3090", 24.0, 8.6),) * 2, "def456")  # a new inventory: new probe
    state = gpu_state_field(other, set)["gpu_state"]
    assert [g["index"] for g in state] == [0, 1] and all(g["mig_mode"] == "" for g in state)


@pytest.mark.parametrize(("item", "field"), [
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": -1, "memory_bytes": 0}},
     "heartbeat.gpu_state[0].foreign_processes.count"),
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": 1, "memory_bytes": float("nan")}},
     "heartbeat.gpu_state[0].foreign_processes.memory_bytes"),
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": 1, "memory_bytes": float("inf")}},
     "heartbeat.gpu_state[0].foreign_processes.memory_bytes"),
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": 1, "memory_bytes": 1.5}},
     "heartbeat.gpu_state[0].foreign_processes.memory_bytes"),
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": True, "memory_bytes": 0}},
     "heartbeat.gpu_state[0].foreign_processes.count"),
    ({"index": 0, "mig_mode": "maybe", "foreign_processes": {"count": 0, "memory_bytes": 0}},
     "heartbeat.gpu_state[0].mig_mode"),
    ({"index": 0, "mig_mode": "enabled", "mig_instances": [{"uuid": "MIG-x", "memory_bytes": -5}],
      "foreign_processes": {"count": 0, "memory_bytes": 0}}, "heartbeat.gpu_state[0].mig_instances[0].memory_bytes"),
    ({"index": 0, "mig_mode": "", "foreign_processes": {"count": 1, "memory_bytes": 0, "pids": [0]}},
     "heartbeat.gpu_state[0].foreign_processes.pids[0]"),
    ({"index": 99, "mig_mode": "", "foreign_processes": {"count": 0, "memory_bytes": 0}},
     "heartbeat.gpu_state[0].index"),
    ({"index": 0, "mig_mode": ""}, "heartbeat.gpu_state[0].foreign_processes"),
])
def test_malformed_gpu_state_is_refused_with_the_field_named(item: dict[str, Any], field: str) -> None:
    with pytest.raises(GpuStateError) as refused:
        check_gpu_state("heartbeat", [item])
    assert str(refused.value).startswith(field + ":")



def test_the_agents_gpu_state_is_what_the_portal_accepts(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The agent's hello and heartbeat add ``Agent._gpu_state()``: with its jobs' PIDs, from the recording the
    environment names (the agent itself is not started here: it would set up job confinement)."""
    from nodeagent.agent import Agent
    from portal.control.link.protocol import validate

    with processes(lab=2) as p:
        record = rebind(load("rtx3090_owner.json"),
                        {31337: p.job, 31338: p.worker, 52001: p.lab[0], 52002: p.lab[1], 2400: p.gone})
        path = tmp_path / "recording.json"
        path.write_text(json.dumps(record))
        monkeypatch.setenv(RECORDING_ENV, str(path))
        gpus = simulated_inventory((SimulatedGpu("RTX 3090", 24.0, 8.6),) * 2, "nvml01")
        agent = SimpleNamespace(gpus=gpus, jobs={"7": SimpleNamespace(member_pids=lambda: {p.job})})  # a RunningJob
        state = Agent._gpu_state(agent)  # type: ignore[arg-type]
    heartbeat = {"type": "heartbeat", "seq": 1, "gpu_util": [90.0, 0.0], "egress": {}, "jobs": [], **state}
    assert validate(heartbeat) == "heartbeat"
    gpu0, gpu1 = heartbeat["gpu_state"]
    assert gpu0["foreign_processes"]["count"] == 0  # the job's leader and its setsid worker
    assert gpu1["foreign_processes"] == {"count": 2, "memory_bytes": 5100273664, "pids": sorted(p.lab)}
