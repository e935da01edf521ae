"""Confinement inside a delegated cgroup (design §19.6: the systemd unit's ``Delegate=yes``), on this host's real
cgroup v1 hierarchies. PID 1 is not systemd here: the test makes the "unit's cgroup" itself and names it in a fake
``/proc/self/cgroup``; the agent must then put its jobs under it (``<own>/jobs/job-<id>``), limits and kill
included, and touch nothing above it."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.confine import DELEGATED_JOBS, CgroupV1, Confiner, Limits, cgroup_mounts
from tests.confine.conftest import cgroups_here, script

MIB = 1024 * 1024


@pytest.fixture
def own(tmp_path: Path) -> Iterator[tuple[str, dict[str, Path], Path]]:
    """A made-up unit cgroup in the memory, cpu and pids hierarchies and a /proc/self/cgroup naming it."""
    why = cgroups_here()
    v1, _ = cgroup_mounts()
    if why is None and not CgroupV1.available(v1):
        why = "needs cgroup v1 memory, cpu and pids"
    if why is not None:
        pytest.skip(why)
    name = f"rn-delegated-test-{os.getpid()}"
    dirs = {c: v1[c] / name for c in ("memory", "cpu", "pids")}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    fake = tmp_path / "cgroup"
    fake.write_text("".join(f"{n}:{c}:/{name}\n" for n, c in enumerate(dirs, 1)) + "9:freezer:/\n")
    try:
        yield name, dirs, fake
    finally:
        for d in dirs.values():
            for sub in [*sorted(d.rglob("job-*"), reverse=True), d / DELEGATED_JOBS, d]:
                with contextlib.suppress(OSError):
                    sub.rmdir()


def test_jobs_go_under_the_delegated_cgroup_with_limits_and_die_as_a_whole(
        own: tuple[str, dict[str, Path], Path], tmp_path: Path) -> None:
    _, dirs, fake = own
    confiner = Confiner(data_dir=tmp_path / "data", job_user="", proc_cgroup_file=fake, delegated=True)
    backend = confiner.backend
    assert isinstance(backend, CgroupV1)
    assert backend.parent_dirs() == sorted({d / DELEGATED_JOBS for d in dirs.values()})
    cg = backend.create("d1", Limits(memory_bytes=64 * MIB, cpu_cores=0.5, pids_max=32))
    assert cg.settings()["memory.limit_in_bytes"] == str(64 * MIB) and cg.settings()["pids.max"] == "32"
    proc = subprocess.Popen(["sleep", "30"], preexec_fn=cg.enter)
    try:
        deadline = time.monotonic() + 10
        while proc.pid not in cg.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        for controller, d in dirs.items():  # in the job's cgroup of every hierarchy used, below the unit's
            assert str(proc.pid) in (d / DELEGATED_JOBS / "job-d1" / "cgroup.procs").read_text().split(), controller
        assert cg.remove()
        assert proc.wait(timeout=10) == -9
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    confiner.backend_idle()
    assert not any((d / DELEGATED_JOBS).exists() for d in dirs.values())
    assert all(d.is_dir() for d in dirs.values())  # the unit's own cgroup is systemd's: left in place


UNIT_CAPS = "setuid,setgid,chown,fowner,dac_override,kill"  # SWITCH_USER_CAPABILITIES, as setpriv names them


def test_a_non_root_agent_with_the_units_capabilities_confines_a_job_as_nobody(space: Path) -> None:
    """What the shipped unit sets up, without systemd: uid ``daemon`` holding only the unit's confinement
    capabilities (ambient, no new privileges), its process in a cgroup chowned to it, ``RECLAIMNET_AGENT_DELEGATED=1``. The
    job must run as nobody with no capability, in ``<that cgroup>/jobs/job-1``; the agent must read its 0700
    directories, stop and kill it, remove its orphan temporary and take its directories back."""
    v1, _ = cgroup_mounts()
    if not CgroupV1.available(v1) or not shutil.which("setpriv"):
        pytest.skip("needs cgroup v1 memory, cpu and pids and setpriv")
    agent_uid = pwd.getpwnam("daemon").pw_uid
    data = space / "data"
    data.mkdir(mode=0o711)
    os.chown(data, agent_uid, agent_uid)
    job = script(space, "job.py", "import json, os, time\nfrom pathlib import Path\n"
                 "d = Path(os.environ['RECLAIMNET_CKPT_DIR'])\n"
                 "(d / f'.ckpt-00000001.ckpt.tmp-{os.getpid()}').write_bytes(b'half')\n"
                 "Path(os.environ['RECLAIMNET_PROGRESS_FILE']).write_text(json.dumps({'step': os.getuid()}))\n"
                 "time.sleep(60)\n")
    name = f"rn-unit-test-{os.getpid()}"
    units = [v1[c] / name for c in ("memory", "cpu", "pids")]
    for d in units:  # what systemd's Delegate=yes does on v1: the unit's cgroup, chowned to User=
        d.mkdir()
        for path in (d, d / "cgroup.procs", d / "tasks"):
            os.chown(path, agent_uid, agent_uid)
    enter = "; ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in units)
    setpriv = (f"setpriv --reuid=daemon --regid=daemon --clear-groups --inh-caps=+{UNIT_CAPS.replace(',', ',+')} "
               f"--ambient-caps=+{UNIT_CAPS.replace(',', ',+')} --no-new-privs")
    agent = Path(__file__).with_name("delegated_agent.py")
    try:
        done = subprocess.run(["sh", "-c", f"{enter}; exec {setpriv} {sys.executable} {agent} {space} '{job}'"],
                              capture_output=True, text=True, timeout=60,
                              env={"RECLAIMNET_AGENT_DELEGATED": "1", "PATH": "/usr/bin:/bin", "HOME": "/"})
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for d in units:
            for sub in (d / DELEGATED_JOBS / "job-1", d / DELEGATED_JOBS, d):
                with contextlib.suppress(OSError):
                    sub.rmdir()
    nobody = pwd.getpwnam("nobody").pw_uid
    assert seen["uid"] == agent_uid and seen["can_switch"] and seen["users"] and seen["backend"] == "cgroup_v1"
    assert seen["parents"] == [str(d / DELEGATED_JOBS) for d in sorted(units)]
    assert seen["job_uid_read_by_agent"] == nobody and seen["ckpt_owner_while_running"] == nobody
    assert seen["job_cgroups"] == [f"/{name}/{DELEGATED_JOBS}/job-1"]
    assert seen["job_caps"] == ["0000000000000000"]
    assert seen["state_after_sigstop"] == "T"
    assert len(seen["temporaries_while_running"]) == 1 and seen["left_in_ckpt_dir"] == []
    assert seen["ckpt_owner_after"] == agent_uid
    assert not any(d.exists() for d in units)
