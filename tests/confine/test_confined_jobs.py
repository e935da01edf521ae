"""Confined jobs (design §19), on this host's real cgroups (v1 here: memory, cpu, pids, freezer, devices), as root.

Every job goes through the agent's own paths: ``Agent._cmd_start_job`` → ``runner.start_job`` with the agent's
:class:`~nodeagent.confine.Confiner`, the watch loop's exit report, ``_cmd_stop_job``'s kill. The jobs run as
other users (``nobody``, or one uid per job from ``job_uid_base``) with ``/usr/bin/python3``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.__main__ import main as agent_main
from nodeagent.agent import Agent
from nodeagent.config import ConfigError, build_config
from tests.confine.conftest import script

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024
UID_BASE = 200_000  # no passwd entries there


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("type") == kind]


def _agent(space: Path, **extra: Any) -> Any:
    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(space / "data"),
                        "base_dir": str(space / "scripts"), "enforcement": "off", **extra}, {})
    agent = Agent(cfg)
    agent.ws = _Socket()
    return agent


async def _start(agent: Any, job_id: int, command: str, gpus: list[int] | None = None, **fields: Any) -> Any:
    await agent._cmd_start_job({"type": "start_job", "job_id": job_id, "command": command, "gpus": gpus or [0],
                                "interval_s": 60.0, "next_sequence": 1, "restore_sequence": None, **fields})
    return agent.jobs[str(job_id)]


async def _exited(agent: Any, job_id: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run the agent's watch loop until it reports the job's exit; its job_exited message."""
    deadline = time.monotonic() + timeout_s
    while str(job_id) in agent.jobs:
        assert time.monotonic() < deadline, f"job {job_id} did not exit"
        await agent._watch_once()
        await asyncio.sleep(0.05)
    return next(m for m in agent.ws.of("job_exited") if m["job_id"] == job_id)


async def _wait_for(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        await asyncio.sleep(0.05)
    return path.read_text().strip()


def _gone_or_dead(pid: int) -> bool:
    """The process no longer exists, or is a zombie waiting for its reaper (it runs no more)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status or "\nState:\tX" in status


def _cgroup_dirs(agent: Any, job_id: int) -> list[Path]:
    return [p / f"job-{job_id}" for p in agent.confiner.backend.parent_dirs()]


@pytest.mark.asyncio
async def test_a_job_over_its_memory_limit_is_killed_by_the_kernel_and_reported(space: Path) -> None:
    agent = _agent(space, job_user="nobody")
    command = script(space, "hog.py", "import os\nprint('uid', os.getuid(), flush=True)\n"
                                      "hog = bytearray(256 * 1024 * 1024)\nprint('survived')\n")
    run = await _start(agent, 11, command, memory_bytes=64 * MIB)  # the start command's limit wins
    assert run.confinement.cgroup.settings()["memory.limit_in_bytes"] == str(64 * MIB)
    exited = await _exited(agent, 11)
    assert exited["reason"] == f"memory limit exceeded ({64 * MIB} bytes)"
    assert exited["returncode"] == -signal.SIGKILL
    log_text = (space / "data" / "jobs" / "11" / "work" / "job.log").read_text()
    assert "uid 65534" in log_text and "survived" not in log_text  # it ran as nobody and did not get its memory


@pytest.mark.asyncio
async def test_a_job_cannot_read_another_jobs_checkpoints_running_or_at_rest(space: Path) -> None:
    agent = _agent(space, job_uid_base=UID_BASE, job_uid_count=4)
    writer = script(space, "writer.py",
                    "import os, pathlib, time\n"
                    "ckpt = pathlib.Path(os.environ['RECLAIMNET_CKPT_DIR'])\n"
                    "(ckpt / 'weights.bin').write_bytes(b'secret')\n"
                    "(pathlib.Path(os.environ['RECLAIMNET_WORK_DIR']) / 'ready').write_text(str(os.getuid()))\n"
                    "time.sleep(60)\n")
    reader = script(space, "reader.py",
                    "import os, sys\n"
                    "try:\n"
                    "    open(sys.argv[1], 'rb').read()\n"
                    "    print('READ', os.getuid())\n"
                    "except PermissionError:\n"
                    "    print('PermissionError', os.getuid())\n")
    secret = space / "data" / "ckpt" / "21" / "weights.bin"
    await _start(agent, 21, writer)
    writer_uid = int(await _wait_for(space / "data" / "jobs" / "21" / "work" / "ready"))
    assert writer_uid == UID_BASE  # the first slot
    assert secret.stat().st_uid == UID_BASE and (secret.parent.stat().st_mode & 0o777) == 0o700

    await _start(agent, 22, f"{reader} {secret}")  # a second job, running beside it, in the next slot
    assert (await _exited(agent, 22))["returncode"] == 0
    assert (space / "data" / "jobs" / "22" / "work" / "job.log").read_text().split() == [
        "PermissionError", str(UID_BASE + 1)]

    await agent._cmd_stop_job({"type": "stop_job", "job_id": 21, "reason": "cancelled"})
    assert (await _exited(agent, 21))["reason"] == "cancelled"
    assert secret.stat().st_uid == os.geteuid()  # at rest a job's files are the agent's ...
    assert secret.read_bytes() == b"secret"  # ... which still reads them (to send them to another node)

    await _start(agent, 23, f"{reader} {secret}")  # slot 0 again: the uid job 21 had
    assert (await _exited(agent, 23))["returncode"] == 0
    assert (space / "data" / "jobs" / "23" / "work" / "job.log").read_text().split() == [
        "PermissionError", str(UID_BASE)]


STOPS = {  # every way the agent stops a job: the portal's cancel, the kill-switch, a reclaim's deadline
    "cancel": ({"type": "stop_job", "job_id": 31, "reason": "cancelled"}, "cancelled"),
    "killswitch": ({"type": "killswitch", "engaged": True, "stop_jobs": True}, "kill-switch"),
    "deadline": ({"type": "reclaim_notice", "deadline_in_s": 0.0}, "reclaim deadline"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("how", sorted(STOPS))
async def test_a_grandchild_that_left_the_session_dies_with_the_job(space: Path, how: str) -> None:
    agent = _agent(space, job_user="nobody")
    command = script(space, "escape.py",
                     "import os, pathlib, time\n"
                     "work = pathlib.Path(os.environ['RECLAIMNET_WORK_DIR'])\n"
                     "if os.fork() == 0:\n"
                     "    os.setsid()  # its own session and process group: killpg of the job misses it\n"
                     "    if os.fork() == 0:\n"
                     "        (work / 'grandchild').write_text(str(os.getpid()))\n"
                     "        time.sleep(60)\n"
                     "    os._exit(0)\n"
                     "time.sleep(60)\n")
    run = await _start(agent, 31, command)
    pid = int(await _wait_for(space / "data" / "jobs" / "31" / "work" / "grandchild"))
    assert os.getpgid(pid) != run.proc.pid  # it did escape the job's process group
    assert pid in run.confinement.cgroup.pids()  # ... but not its cgroup

    command, reason = STOPS[how]
    await agent._on_message(json.dumps(command))
    exited = await _exited(agent, 31)
    assert exited["reason"] == reason
    deadline = time.monotonic() + 10
    while not _gone_or_dead(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _gone_or_dead(pid)
    assert not any(d.exists() for d in _cgroup_dirs(agent, 31))


@pytest.mark.asyncio
async def test_the_cpu_quota_and_limits_are_written(space: Path) -> None:
    agent = _agent(space, job_user="nobody", cpu_cores_per_gpu=0.5, memory_bytes_per_gpu=128 * MIB,
                   job_pids_max=64)
    sleeper = script(space, "sleeper.py", "import time\ntime.sleep(60)\n")
    by_default = await _start(agent, 41, sleeper, gpus=[0, 1])  # per-GPU defaults × 2 GPUs
    asked = await _start(agent, 42, sleeper, gpus=[2], cpu_cores=0.25, memory_bytes=96 * MIB)
    default_settings = by_default.confinement.cgroup.settings()
    asked_settings = asked.confinement.cgroup.settings()
    for job in (41, 42):
        await agent._cmd_stop_job({"type": "stop_job", "job_id": job, "reason": "cancelled"})
        await _exited(agent, job)
    if "cpu.cfs_quota_us" in default_settings:  # cgroup v1
        assert (default_settings["cpu.cfs_quota_us"], default_settings["cpu.cfs_period_us"]) == ("100000", "100000")
        assert asked_settings["cpu.cfs_quota_us"] == "25000"
        assert default_settings["memory.limit_in_bytes"] == str(256 * MIB)
        assert asked_settings["memory.limit_in_bytes"] == str(96 * MIB)
    else:  # cgroup v2
        assert default_settings["cpu.max"] == "100000 100000" and asked_settings["cpu.max"] == "25000 100000"
        assert default_settings["memory.max"] == str(256 * MIB)
    assert default_settings["pids.max"] == "64"


@pytest.mark.asyncio
async def test_the_cgroup_is_removed_after_the_job_ends(space: Path) -> None:
    agent = _agent(space, allow_unconfined_jobs=True)  # this machine's interpreter is closed to job users
    command = script(space, "quick.py", "print('done')\n")
    run = await _start(agent, 51, command)
    dirs = [d for d in _cgroup_dirs(agent, 51)]
    assert dirs and all(d.is_dir() for d in dirs)
    assert run.confinement.cgroup is not None
    exited = await _exited(agent, 51)
    assert (exited["returncode"], exited["reason"]) == (0, "completed")
    assert not any(d.exists() for d in dirs)
    assert not any(p.exists() for p in agent.confiner.backend.parent_dirs())  # the agent's parent went with it


def test_configuration_errors_name_the_field(space: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(space / "data")}
    cases = {
        "job_user": {"job_user": "no-such-user-rn"},
        "job_uid_base": {"job_uid_base": 65534 - 10},  # would include nobody's uid
        "job_uid_count": {"job_uid_count": 0},
        "confinement": {"confinement": "lxc"},
        "memory_bytes_per_gpu": {"memory_bytes_per_gpu": "1G"},
        "cpu_cores_per_gpu": {"cpu_cores_per_gpu": -1},
        "job_pids_max": {"job_pids_max": 2},
        "cgroup_parent": {"cgroup_parent": "reclaimnet/../escape"},
    }
    for field, values in cases.items():
        with pytest.raises(ConfigError) as err:
            build_config({**base, **values}, {})
        assert str(err.value).startswith(f"{field}:"), str(err.value)
        if field == "job_uid_base":
            assert "nobody" in str(err.value)  # the user whose uid is in the range

    # A configured user that cannot reach data_dir: the agent refuses to start (exit 2), naming job_user.
    hidden = space / "hidden"
    hidden.mkdir(mode=0o700)
    config = space / "agent.json"
    config.write_text(json.dumps({**base, "data_dir": str(hidden / "data"), "job_user": "nobody",
                                  "enforcement": "off"}))
    assert agent_main(["--config", str(config)]) == 2
    assert "error: job_user: uid 65534 cannot reach data_dir" in capsys.readouterr().err


def test_an_agent_that_cannot_confine_its_jobs_refuses_to_start_unless_its_config_allows_it(
        space: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Design §19.6: jobs run each in its own cgroup as a user other than the agent's, or the agent does not start
    (exit 2, the message naming allow_unconfined_jobs and why) unless ``allow_unconfined_jobs`` is true; then it
    warns and its hello tells the portal (the node page shows it)."""
    base = {"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(space / "data"), "enforcement": "off",
            "base_dir": str(space / "scripts")}
    for values, why in (({"confinement": "off"}, "no usable cgroup hierarchy (confinement off"),
                        ({"job_user": ""}, "jobs would run as the agent's own user root")):
        config = space / "agent.json"
        config.write_text(json.dumps({**base, **values}))
        assert agent_main(["--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: allow_unconfined_jobs: jobs would run unconfined here: "), err
        assert why in err, err

    with caplog.at_level(logging.WARNING, logger="nodeagent.agent"):
        allowed = _agent(space, confinement="off", allow_unconfined_jobs=True)
    assert "jobs run unconfined (allow_unconfined_jobs is true): no usable cgroup hierarchy" in caplog.text
    assert allowed._hello()["confinement"].startswith("unconfined: no usable cgroup hierarchy")

    confined = _agent(space, job_uid_base=UID_BASE, job_uid_count=4)  # the default: refused nothing
    assert confined._hello()["confinement"] == (
        f"confined: {confined.confiner.backend.name} cgroups, as uids {UID_BASE}..{UID_BASE + 3}, one per running job")


@pytest.mark.asyncio
async def test_a_restarted_job_owns_the_checkpoints_that_landed_while_it_was_away(space: Path) -> None:
    """Files the agent wrote into a job's checkpoint directory (a transfer received, as root, mode 0600) belong to
    the job's uid when it starts again there, whichever uid slot it gets this time."""
    agent = _agent(space, job_uid_base=UID_BASE, job_uid_count=4)
    ckpt = space / "data" / "ckpt" / "61"
    first = script(space, "first.py", "import os, pathlib\n"
                                      "pathlib.Path(os.environ['RECLAIMNET_CKPT_DIR'], 'a.bin').write_bytes(b'a')\n")
    await _start(agent, 61, first)
    assert (await _exited(agent, 61))["returncode"] == 0
    landed = ckpt / "landed.bin"
    landed.write_bytes(b"received")  # what the data server writes, as the agent's user
    os.chmod(landed, 0o600)

    holder = script(space, "holder.py", "import time\ntime.sleep(60)\n")
    await _start(agent, 62, holder)  # takes slot 0: job 61 comes back with another uid
    resumed = script(space, "resumed.py",
                     "import os, pathlib\n"
                     "ckpt = pathlib.Path(os.environ['RECLAIMNET_CKPT_DIR'])\n"
                     "assert (ckpt / 'a.bin').read_bytes() == b'a' and (ckpt / 'landed.bin').read_bytes() == b'received'\n"
                     "(ckpt / 'b.bin').write_bytes(b'b')\n"
                     "print('OK', os.getuid(), ckpt.stat().st_uid)\n")
    await _start(agent, 61, resumed)
    exited = await _exited(agent, 61)
    assert exited["returncode"] == 0
    assert (space / "data" / "jobs" / "61" / "work" / "job.log").read_text().split()[-3:] == [
        "OK", str(UID_BASE + 1), str(UID_BASE + 1)]
    assert {p.stat().st_uid for p in ckpt.iterdir()} == {os.geteuid()}  # the agent's again, at rest
    await agent._cmd_stop_job({"type": "stop_job", "job_id": 62, "reason": "cancelled"})
    await _exited(agent, 62)


def _state(pid: int) -> str:
    return next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("State:"))


@pytest.mark.asyncio
async def test_a_fenced_job_is_paused_with_the_forks_that_left_its_group(space: Path) -> None:
    """Fencing (design §9.10) pauses a job with SIGSTOP: that reaches every process of its cgroup."""
    agent = _agent(space, job_user="nobody")
    command = script(space, "escape2.py",
                     "import os, pathlib, time\n"
                     "if os.fork() == 0:\n"
                     "    os.setsid()\n"
                     "    pathlib.Path(os.environ['RECLAIMNET_WORK_DIR'], 'child').write_text(str(os.getpid()))\n"
                     "    time.sleep(60)\n"
                     "time.sleep(60)\n")
    run = await _start(agent, 71, command)
    pid = int(await _wait_for(space / "data" / "jobs" / "71" / "work" / "child"))
    run.signal(signal.SIGSTOP)  # what check_fence sends
    deadline = time.monotonic() + 10
    while _state(pid) != "T" and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _state(pid) == "T"
    run.signal(signal.SIGCONT)  # what the welcome that unfences sends
    while _state(pid) == "T" and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _state(pid) in ("S", "R")
    await agent._cmd_stop_job({"type": "stop_job", "job_id": 71, "reason": "cancelled"})
    await _exited(agent, 71)


@pytest.mark.asyncio
async def test_a_daemonised_gpu_process_of_a_job_is_the_jobs_not_the_owners(space: Path, monkeypatch: Any) -> None:
    """Owner use goes by cgroup membership (design §1 "Owner activity and MIG"): a job's process that double-forked
    away from its session and process tree (re-parented to init) still counts as the job's use of the GPU; a
    process outside every job's cgroup is the owner's."""
    import subprocess

    from nodeagent import inventory as inv

    agent = _agent(space, job_user="nobody")
    command = script(space, "daemon.py",
                     "import os, pathlib, time\n"
                     "work = pathlib.Path(os.environ['RECLAIMNET_WORK_DIR'])\n"
                     "if os.fork() == 0:\n"
                     "    os.setsid()\n"
                     "    parent = os.getpid()\n"
                     "    if os.fork() == 0:\n"
                     "        while os.getppid() == parent:  # until its parent has exited and init adopted it\n"
                     "            time.sleep(0.01)\n"
                     "        (work / 'daemon').write_text(str(os.getpid()))\n"
                     "        time.sleep(60)\n"
                     "    os._exit(0)\n"
                     "time.sleep(60)\n")
    lab = subprocess.Popen(["sleep", "60"])  # the provider's own process on the GPU
    try:
        run = await _start(agent, 51, command)
        daemon = int(await _wait_for(space / "data" / "jobs" / "51" / "work" / "daemon"))
        assert inv.owned_by_jobs(daemon, {run.proc.pid}) is False  # the process tree alone calls it the owner's
        recording = space / "gpus.json"
        recording.write_text(json.dumps({"devices": [{
            "index": 0, "uuid": "GPU-cgroup-test", "name": "recorded", "memory_total_bytes": 1 << 34,
            "mig_mode": None, "utilisation_pct": 90,
            "processes": [{"pid": daemon, "used_memory_bytes": 3 << 30},
                          {"pid": lab.pid, "used_memory_bytes": 1 << 30}],
        }]}))
        monkeypatch.setenv(inv.RECORDING_ENV, str(recording))
        monkeypatch.setattr(inv, "_probes", {})
        agent.gpus = inv.simulated_inventory(agent.config.simulate_gpus, "cgtest")
        state = agent._gpu_state()["gpu_state"][0]
        assert state["foreign_processes"] == {"count": 1, "memory_bytes": 1 << 30, "pids": [lab.pid]}
        await agent._cmd_stop_job({"type": "stop_job", "job_id": 51, "reason": "cancelled"})
        await _exited(agent, 51)
    finally:
        lab.kill()
        lab.wait()
