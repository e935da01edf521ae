"""Confined jobs (design §19): every job in a cgroup of its own, with limits, killed as a whole, as another user.

One interface, :class:`JobCgroup` made by a :class:`CgroupBackend`, with two backends found at run time:

- :class:`CgroupV2`, the unified hierarchy, usable only where ``memory``, ``cpu`` and ``pids`` are listed in its
  root's ``cgroup.controllers`` (a hybrid host mounts an empty one at ``/sys/fs/cgroup/unified``);
- :class:`CgroupV1`, one hierarchy per controller (``memory``, ``cpu``, ``pids``; ``freezer`` and ``devices`` when
  mounted), found in ``/proc/self/mounts`` (``cpu,cpuacct`` mounted together is one hierarchy).

Layout: ``<hierarchy>/<cgroup_parent>/job-<id>``, the parent per agent (``reclaimnet/agent-<hash of data_dir>``
unless configured; ``<own cgroup>/jobs`` when a systemd unit delegated the agent its cgroup and none is configured,
design §19.6), made at the first job and removed with the last. The child process moves itself into its
cgroup before it execs (:meth:`JobConfinement.child_setup`, called from ``preexec_fn``: no window in which a fork
could escape), then drops to the job's user: ``setgroups([])``, ``setgid``, ``setuid``.

:class:`Confiner` is the agent's side: it picks the backend and the job users once, then :meth:`Confiner.begin`
confines one job and :meth:`JobConfinement.end` kills what is left of it, reads the kernel's OOM count, removes its
cgroup and hands its directories back to the agent.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config import ConfigError
from nodeagent.jobusers import (  # noqa: F401 (re-exported: the job users of design §19.5)
    DEFAULT_JOB_USER,
    SWITCH_USER_CAPABILITIES,
    JobUser,
    UserPolicy,
    can_switch_users,
    chown_tree,
    unreachable,
)

log = logging.getLogger("nodeagent.confine")

MODES = ("auto", "off", "cgroup_v1", "cgroup_v2")
REQUIRED_CONTROLLERS = ("memory", "cpu", "pids")
V1_OPTIONAL = ("freezer", "devices")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses less than 1 ms per period
KILL_ROUNDS = 200  # kill passes over a cgroup before giving up (each waits KILL_WAIT_S when something is left)
KILL_WAIT_S = 0.01
RMDIR_TRIES = 100  # a cgroup whose last task is still exiting is busy for a moment
NVIDIA_MAJOR = 195  # /dev/nvidiaN are character devices 195:N; 195:255 is nvidiactl
DELEGATED_JOBS = "jobs"  # under systemd's Delegate=yes: job cgroups in <the unit's cgroup>/jobs (design §19.6)
DELEGATED_LEAF = "agent"  # v2: the agent moves itself into <the unit's cgroup>/agent (no internal processes)


def default_cgroup_parent(data_dir: Path) -> str:
    """``reclaimnet/agent-<12 hex of sha256(data_dir)>``: one parent per agent, even several on one host."""
    return "reclaimnet/agent-" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Limits:
    """What one job may use: bytes of memory (RAM; no swap beyond it), CPU cores (a CFS quota), processes."""

    memory_bytes: int | None = None
    cpu_cores: float | None = None
    pids_max: int | None = None
    gpus: tuple[int, ...] = ()


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _pids(procs_file: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(line) for line in _read(procs_file).split() if line.strip()]
    return []


def _keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``memory.events``, ``memory.oom_control``) as a dict of integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _rmdir(path: Path) -> bool:
    """Remove an (empty of tasks) cgroup directory; True when it is gone."""
    for _ in range(RMDIR_TRIES):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("cgroup %s not removed: %s", path, exc)
                return False
            time.sleep(KILL_WAIT_S)
    log.warning("cgroup %s still busy: not removed", path)
    return False


def _nvidia_minors(dev: Path = Path("/dev")) -> list[int]:
    """The GPU device files present (``/dev/nvidiaN``, N their minor numbers); none on a host without GPUs."""
    out = []
    with contextlib.suppress(OSError):
        for entry in dev.iterdir():
            m = re.fullmatch(r"nvidia(\d+)", entry.name)
            if m and entry.is_char_device():
                out.append(int(m.group(1)))
    return sorted(out)


class JobCgroup(ABC):
    """One job's cgroup (in every hierarchy its backend uses)."""

    def __init__(self, job_id: str, dirs: list[Path], limits: Limits) -> None:
        self.job_id = job_id
        self.dirs = dirs
        self.limits = limits
        # Prepared here, used in the forked child before exec: nothing but os.open/os.write there.
        self._procs_files = [str(d / "cgroup.procs") for d in dirs]

    def enter(self) -> None:
        """In the child, before exec: move this process into the cgroup (its later forks follow it)."""
        pid = str(os.getpid()).encode()
        for name in self._procs_files:
            fd = os.open(name, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    @property
    @abstractmethod
    def procs_file(self) -> Path:
        """The ``cgroup.procs`` that lists every process of the job."""

    def pids(self) -> list[int]:
        return _pids(self.procs_file)

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` to every process in the cgroup (pause and resume a job, with its escaped forks)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    @abstractmethod
    def _freeze(self, frozen: bool) -> bool:
        """Freeze (no task runs or forks) or thaw the cgroup; False when the backend cannot."""

    def kill_all(self) -> bool:
        """SIGKILL every process in the cgroup, frozen first so none forks meanwhile, until it is empty (a
        grandchild that left the job's session with ``setsid`` is still in it). True when it is empty."""
        for _ in range(KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                return True
            frozen = self._freeze(True)
            for pid in self.pids() if frozen else pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if frozen:
                self._freeze(False)  # a frozen task dies of its SIGKILL once thawed
            if self.pids():
                time.sleep(KILL_WAIT_S)
        left = self.pids()
        if left:
            log.warning("job %s: processes %s survived %d kill passes", self.job_id, left[:10], KILL_ROUNDS)
        return not left

    @abstractmethod
    def oom_kills(self) -> int:
        """How many processes of the job the kernel's OOM killer killed for its memory limit."""

    @abstractmethod
    def memory_peak_bytes(self) -> int | None:
        """The most memory the job used (None: the kernel does not say)."""

    @abstractmethod
    def settings(self) -> dict[str, str]:
        """The limit files as the kernel reads them back (file name → content)."""

    def remove(self) -> bool:
        """Kill what is left, then remove the cgroup from every hierarchy. True when all is gone."""
        self.kill_all()
        return all([_rmdir(d) for d in self.dirs])


class CgroupBackend(ABC):
    """Makes job cgroups under one parent per agent."""

    name = ""

    def __init__(self, parent: str) -> None:
        self.parent = parent.strip("/")

    @abstractmethod
    def parent_dirs(self) -> list[Path]:
        """The agent's parent cgroup in each hierarchy used."""

    @abstractmethod
    def _make(self, job_id: str, limits: Limits) -> JobCgroup:
        """Create the job's cgroup(s) and write its limits."""

    def create(self, job_id: str, limits: Limits) -> JobCgroup:
        """The job's cgroup with its limits; a leftover of the same name (a run before) is killed and removed."""
        self.remove_job(job_id)
        return self._make(job_id, limits)

    def remove_job(self, job_id: str) -> None:
        for parent in self.parent_dirs():
            d = parent / f"job-{job_id}"
            if d.is_dir():
                self._existing(job_id).remove()
                return

    @abstractmethod
    def _existing(self, job_id: str) -> JobCgroup:
        """The job's cgroup as it is on disk (no limits written)."""

    def leftovers(self) -> list[str]:
        """Job ids whose cgroups are under this agent's parent (a predecessor's)."""
        found: set[str] = set()
        for parent in self.parent_dirs():
            with contextlib.suppress(OSError):
                found |= {d.name[4:] for d in parent.iterdir() if d.is_dir() and d.name.startswith("job-")}
        return sorted(found)

    def remove_parent_if_empty(self) -> None:
        for parent in self.parent_dirs():
            with contextlib.suppress(OSError):
                parent.rmdir()  # EBUSY while a job cgroup is under it: kept

    @abstractmethod
    def check(self) -> None:
        """Raise OSError when this agent cannot make cgroups here (read-only, not delegated)."""

    def prepare(self) -> None:
        """Once, after :meth:`check` passed: whatever the layout needs before the first job (nothing by default)."""
        return None


# --- cgroup v1 ----------------------------------------------------------------------------------------------------
class JobCgroupV1(JobCgroup):
    def __init__(self, job_id: str, by_controller: dict[str, Path], limits: Limits) -> None:
        self.by_controller = by_controller
        super().__init__(job_id, sorted(set(by_controller.values())), limits)

    @property
    def procs_file(self) -> Path:
        return self.by_controller["pids"] / "cgroup.procs"

    def _freeze(self, frozen: bool) -> bool:
        d = self.by_controller.get("freezer")
        if d is None:
            return False
        try:
            _write(d / "freezer.state", "FROZEN" if frozen else "THAWED")
            for _ in range(100 if frozen else 0):  # FREEZING until every task stopped
                if _read(d / "freezer.state").strip() == "FROZEN":
                    break
                time.sleep(0.001)
        except OSError:
            return False
        return True

    def oom_kills(self) -> int:
        d = self.by_controller["memory"]
        with contextlib.suppress(OSError):
            counts = _keyed(_read(d / "memory.oom_control"))
            if "oom_kill" in counts:  # kernel 4.13+
                return counts["oom_kill"]
            return 1 if int(_read(d / "memory.failcnt")) > 0 and self.limits.memory_bytes else 0
        return 0

    def memory_peak_bytes(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(_read(self.by_controller["memory"] / "memory.max_usage_in_bytes"))
        return None

    def settings(self) -> dict[str, str]:
        out = {}
        for controller, name in (("memory", "memory.limit_in_bytes"), ("memory", "memory.memsw.limit_in_bytes"),
                                 ("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.cfs_period_us"), ("pids", "pids.max"),
                                 ("devices", "devices.list")):
            d = self.by_controller.get(controller)
            if d is not None and (d / name).exists():
                out[name] = _read(d / name).strip()
        return out


def cgroup_mounts(mounts_file: Path = Path("/proc/self/mounts")) -> tuple[dict[str, Path], Path | None]:
    """The v1 hierarchies (controller → mount point) and the v2 mount point (None: not mounted)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with contextlib.suppress(OSError):
        for line in _read(mounts_file).splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            where = Path(parts[1].encode().decode("unicode_escape"))  # \040 for a space
            if parts[2] == "cgroup2" and v2 is None:
                v2 = where
            elif parts[2] == "cgroup":
                for option in parts[3].split(","):
                    if option in REQUIRED_CONTROLLERS + V1_OPTIONAL:
                        v1.setdefault(option, where)
    return v1, v2


class CgroupV1(CgroupBackend):
    """cgroup v1: the job's cgroup in the memory, cpu and pids hierarchies (freezer and devices when mounted)."""

    name = "cgroup_v1"

    def __init__(self, mounts: dict[str, Path], parent: str, delegated: dict[str, str] | None = None) -> None:
        """``delegated``: controller → the agent's own cgroup there (systemd's ``Delegate=yes``); the parent is then
        under it, and only the controllers whose own cgroup is not the root are used."""
        super().__init__(parent)
        self.mounts = {c: p for c, p in mounts.items() if c in REQUIRED_CONTROLLERS + V1_OPTIONAL}
        if delegated is not None:
            self.mounts = {c: p for c, p in self.mounts.items() if delegated.get(c, "/").strip("/")}
        # where the agent writes in each hierarchy: the mount, or its delegated cgroup
        self.tops = {c: m / (delegated or {}).get(c, "").strip("/") for c, m in self.mounts.items()}

    @classmethod
    def available(cls, mounts: dict[str, Path]) -> bool:
        return all(c in mounts for c in REQUIRED_CONTROLLERS)

    def parent_dirs(self) -> list[Path]:
        return sorted({t / self.parent for t in self.tops.values()})

    def check(self) -> None:
        if not self.available(self.mounts):
            raise PermissionError(errno.EACCES, "no delegated cgroup for " + "/".join(REQUIRED_CONTROLLERS))
        for top in sorted(set(self.tops.values())):
            if not os.access(top, os.W_OK):
                raise PermissionError(errno.EACCES, "cgroup hierarchy not writable", str(top))

    def _paths(self, job_id: str) -> dict[str, Path]:
        return {c: t / self.parent / f"job-{job_id}" for c, t in self.tops.items()}

    def _existing(self, job_id: str) -> JobCgroup:
        return JobCgroupV1(job_id, {c: p for c, p in self._paths(job_id).items() if p.is_dir()} or
                           self._paths(job_id), Limits())

    def _make(self, job_id: str, limits: Limits) -> JobCgroup:
        paths = self._paths(job_id)
        for d in sorted(set(paths.values())):
            d.mkdir(parents=True, exist_ok=True)
        cg = JobCgroupV1(job_id, paths, limits)
        try:
            mem = paths["memory"]
            if limits.memory_bytes is not None:
                _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # no swap beyond the limit (swap accounting on)
                    _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            cpu = paths["cpu"]
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(_quota_us(limits.cpu_cores)))
            if limits.pids_max is not None:
                _write(paths["pids"] / "pids.max", str(limits.pids_max))
            if "devices" in paths:
                for minor in _nvidia_minors():  # only the job's GPUs (CUDA_VISIBLE_DEVICES says the same)
                    if minor not in limits.gpus:
                        _write(paths["devices"] / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")
        except BaseException:
            cg.remove()
            raise
        return cg


def _quota_us(cpu_cores: float | None) -> int:
    """The CFS quota per CPU_PERIOD_US for ``cpu_cores`` (-1: none)."""
    if cpu_cores is None:
        return -1
    return max(MIN_CPU_QUOTA_US, round(cpu_cores * CPU_PERIOD_US))


# --- cgroup v2 ----------------------------------------------------------------------------------------------------
class JobCgroupV2(JobCgroup):
    def __init__(self, job_id: str, path: Path, limits: Limits) -> None:
        self.path = path
        super().__init__(job_id, [path], limits)

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def _freeze(self, frozen: bool) -> bool:
        try:
            _write(self.path / "cgroup.freeze", "1" if frozen else "0")
        except OSError:
            return False
        return True

    def kill_all(self) -> bool:
        """``cgroup.kill`` (Linux 5.14+) kills every process at once, no fork escapes; else freeze and kill."""
        if (self.path / "cgroup.kill").exists() and self.pids():
            with contextlib.suppress(OSError):
                _write(self.path / "cgroup.kill", "1")
                for _ in range(KILL_ROUNDS):
                    if not self.pids():
                        return True
                    time.sleep(KILL_WAIT_S)
        return super().kill_all()

    def oom_kills(self) -> int:
        with contextlib.suppress(OSError):
            return _keyed(_read(self.path / "memory.events")).get("oom_kill", 0)
        return 0

    def memory_peak_bytes(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(_read(self.path / "memory.peak"))  # Linux 5.19+
        return None

    def settings(self) -> dict[str, str]:
        return {name: _read(self.path / name).strip()
                for name in ("memory.max", "memory.swap.max", "cpu.max", "pids.max") if (self.path / name).exists()}


class CgroupV2(CgroupBackend):
    """cgroup v2: ``<mount>/<parent>/job-<id>``, the controllers enabled down the parent chain."""

    name = "cgroup_v2"

    def __init__(self, mount: Path, parent: str, delegated: str | None = None) -> None:
        """``delegated``: the agent's own cgroup (systemd's ``Delegate=yes``): the agent moves itself into its leaf
        :data:`DELEGATED_LEAF` and ``parent`` is under it; controllers are enabled from there down only."""
        super().__init__(parent)
        self.mount = mount
        self.delegated = delegated.strip("/") if delegated is not None else None
        self.top = mount / self.delegated if self.delegated else mount

    @classmethod
    def available(cls, mount: Path | None) -> bool:
        """Only where the root lists memory, cpu and pids (an empty ``unified`` mount of a hybrid host is not)."""
        if mount is None:
            return False
        with contextlib.suppress(OSError):
            return set(REQUIRED_CONTROLLERS) <= set(_read(mount / "cgroup.controllers").split())
        return False

    def parent_dirs(self) -> list[Path]:
        return [self.top / self.parent]

    def check(self) -> None:
        if self.delegated is not None:
            listed = ""
            with contextlib.suppress(OSError):
                listed = _read(self.top / "cgroup.controllers")
            if not set(REQUIRED_CONTROLLERS) <= set(listed.split()):
                raise PermissionError(errno.EACCES, "delegated cgroup lacks memory/cpu/pids", str(self.top))
            for name in ("cgroup.procs", "cgroup.subtree_control"):
                if not os.access(self.top / name, os.W_OK):
                    raise PermissionError(errno.EACCES, "cgroup v2 subtree not delegated", str(self.top / name))
            return
        if not os.access(self.mount, os.W_OK) and not os.access(self.mount / self.parent, os.W_OK):
            raise PermissionError(errno.EACCES, "cgroup v2 hierarchy not writable", str(self.mount))

    def prepare(self) -> None:
        """Delegated: move this process into ``<own cgroup>/agent`` so that its own cgroup holds no process and may
        pass its controllers on to the job cgroups beside it (the no-internal-process rule)."""
        if self.delegated is None:
            return
        leaf = self.top / DELEGATED_LEAF
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))

    def _existing(self, job_id: str) -> JobCgroup:
        return JobCgroupV2(job_id, self.top / self.parent / f"job-{job_id}", Limits())

    def _enable_controllers(self) -> None:
        """``+memory +cpu +pids`` in ``cgroup.subtree_control`` from the top the agent may write (the mount, or its
        delegated cgroup) down to the agent's parent (those cgroups hold no process, so the no-internal-process
        rule holds)."""
        d = self.top
        chain = [d] + [d := d / part for part in Path(self.parent).parts]
        for level in chain:
            level.mkdir(exist_ok=True)
            try:
                enabled = set(_read(level / "cgroup.subtree_control").replace("+", "").split())
            except FileNotFoundError:
                enabled = set()
            missing = [c for c in REQUIRED_CONTROLLERS if c not in enabled]
            if missing:
                _write(level / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))

    def _make(self, job_id: str, limits: Limits) -> JobCgroup:
        self._enable_controllers()
        path = self.top / self.parent / f"job-{job_id}"
        path.mkdir(exist_ok=True)
        cg = JobCgroupV2(job_id, path, limits)
        try:
            if limits.memory_bytes is not None:
                _write(path / "memory.max", str(limits.memory_bytes))
                if (path / "memory.swap.max").exists():
                    _write(path / "memory.swap.max", "0")
            quota = _quota_us(limits.cpu_cores)
            _write(path / "cpu.max", f"{'max' if quota < 0 else quota} {CPU_PERIOD_US}")
            if limits.pids_max is not None:
                _write(path / "pids.max", str(limits.pids_max))
        except BaseException:
            cg.remove()
            raise
        return cg


def own_cgroups(proc_cgroup_file: Path = Path("/proc/self/cgroup")) -> tuple[dict[str, str], str | None]:
    """This process's cgroup in each v1 controller's hierarchy and in the v2 one (None: not listed)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    with contextlib.suppress(OSError):
        for line in _read(proc_cgroup_file).splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if ".." in parts[2].split("/"):
                continue  # outside our cgroup namespace's root ("/../.."): never a path under the mount
            if parts[0] == "0" and parts[1] == "":
                v2 = parts[2]
            for controller in parts[1].split(","):
                if controller in REQUIRED_CONTROLLERS + V1_OPTIONAL:
                    v1[controller] = parts[2]
    return v1, v2


DELEGATED_ENV = "RECLAIMNET_AGENT_DELEGATED"  # set by the shipped unit beside Delegate=yes (design §19.6)


def under_systemd_service() -> bool:
    """Whether the unit that started this agent delegated its cgroup to it: the shipped unit says so explicitly
    (``Environment=RECLAIMNET_AGENT_DELEGATED=1`` beside ``Delegate=yes``). ``INVOCATION_ID`` is not enough: every
    process under any unit inherits it (a CI runner, a terminal in a user session), delegated or not."""
    return os.environ.get(DELEGATED_ENV, "") == "1"


def detect(mode: str, parent: str, mounts_file: Path = Path("/proc/self/mounts"), *, delegated: bool = False,
           proc_cgroup_file: Path = Path("/proc/self/cgroup")) -> CgroupBackend | None:
    """The backend for ``mode``: ``auto`` prefers v2 where its controllers are enabled, else v1, else none.

    ``delegated`` (design §19.6: a systemd unit with ``Delegate=yes``, ``cgroup_parent`` unset): first the agent's
    own cgroup, the job cgroups in ``<own>/jobs``; then, as without it, ``parent`` from the hierarchy's root."""
    if mode == "off":
        return None
    v1, v2 = cgroup_mounts(mounts_file)
    candidates: list[CgroupBackend] = []
    if delegated:
        own_v1, own_v2 = own_cgroups(proc_cgroup_file)
        if mode in ("auto", "cgroup_v2") and v2 is not None and (own_v2 or "/").strip("/"):
            candidates.append(CgroupV2(v2, DELEGATED_JOBS, delegated=own_v2))
        if mode in ("auto", "cgroup_v1") and CgroupV1.available(v1):
            candidates.append(CgroupV1(v1, DELEGATED_JOBS, delegated=own_v1))
    if mode in ("auto", "cgroup_v2") and v2 is not None and CgroupV2.available(v2):
        candidates.append(CgroupV2(v2, parent))
    if mode in ("auto", "cgroup_v1") and CgroupV1.available(v1):
        candidates.append(CgroupV1(v1, parent))
    for backend in candidates:
        try:
            backend.check()
            backend.prepare()
        except OSError as exc:
            log.warning("confinement: %s present but not usable by this agent: %s", backend.name, exc)
            continue
        return backend
    return None


# --- the agent's side ---------------------------------------------------------------------------------------------
@dataclass
class JobConfinement:
    """One job's confinement: its cgroup (None: none available), its user (None: the agent's), its directories."""

    job_id: str
    cgroup: JobCgroup | None
    user: JobUser | None
    dirs: list[Path]
    confiner: Confiner
    ended: bool = False
    env: dict[str, str] = field(default_factory=dict)

    def child_setup(self) -> None:
        """In the forked child, before exec: into the cgroup (as root still), then the job's user."""
        if self.cgroup is not None:
            self.cgroup.enter()
        if self.user is not None:
            os.setgroups([])
            os.setgid(self.user.gid)
            os.setuid(self.user.uid)

    def kill_all(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def signal_all(self, signum: int) -> None:
        if self.cgroup is not None:
            self.cgroup.signal_all(signum)

    def end(self) -> str | None:
        """The job's main process ended: kill what is left, read the OOM count, remove the cgroup, give the
        directories back to the agent. Returns the failure reason when the kernel killed it for memory."""
        if self.ended:
            return None
        self.ended = True
        reason = None
        try:
            if self.cgroup is not None:
                self.cgroup.kill_all()
                if self.cgroup.oom_kills() > 0:
                    reason = f"memory limit exceeded ({self.cgroup.limits.memory_bytes} bytes)"
                    peak = self.cgroup.memory_peak_bytes()
                    log.warning("job %s: %s, peak %s bytes", self.job_id, reason, peak)
                self.cgroup.remove()
                self.confiner.backend_idle()
        finally:
            if self.user is not None:
                for d in self.dirs:  # at rest a job's files are the agent's: a later uid in its slot cannot read them
                    with contextlib.suppress(OSError):
                        chown_tree(d, os.geteuid(), os.getegid())
            self.confiner.users.release(self.job_id)
        return reason


class Confiner:
    """The agent's confinement: the cgroup backend and the job users, decided once (design §19)."""

    def __init__(self, *, data_dir: Path, mode: str = "auto", cgroup_parent: str | None = None,
                 job_user: str | None = None, job_uid_base: int | None = None, job_uid_count: int = 256,
                 memory_bytes_per_gpu: int | None = None, cpu_cores_per_gpu: float | None = None,
                 pids_max: int | None = 4096, mounts_file: Path = Path("/proc/self/mounts"),
                 proc_cgroup_file: Path = Path("/proc/self/cgroup"), delegated: bool | None = None) -> None:
        self.data_dir = data_dir
        self.mode = mode
        self.memory_bytes_per_gpu = memory_bytes_per_gpu
        self.cpu_cores_per_gpu = cpu_cores_per_gpu
        self.pids_max = pids_max
        # design §19.6: under a systemd unit (Delegate=yes) with no cgroup_parent, the unit's own cgroup first
        delegated = cgroup_parent is None and under_systemd_service() if delegated is None else delegated
        self.backend = detect(mode, cgroup_parent or default_cgroup_parent(data_dir), mounts_file,
                              delegated=delegated, proc_cgroup_file=proc_cgroup_file)
        if self.backend is None and mode in ("cgroup_v1", "cgroup_v2"):
            raise ConfigError(f"confinement: {mode} is not available on this host (or not writable by the agent)")
        if self.backend is None:
            log.warning("confinement: %s: no usable cgroup hierarchy (needs %s): jobs run without limits",
                        mode, "/".join(REQUIRED_CONTROLLERS))
        else:
            log.info("confinement: %s under %s", self.backend.name, ", ".join(map(str, self.backend.parent_dirs())))
        self.users = UserPolicy(job_user, job_uid_base, job_uid_count)
        self.users.resolve(data_dir, explicit=job_user is not None or job_uid_base is not None)
        if self.users.enabled:
            self.prepare_dirs()

    def unconfined_reasons(self) -> list[str]:
        """Why jobs would not run confined (design §19.6): each in its own cgroup *and* as a user other than the
        agent's. Empty when they are."""
        reasons = []
        if self.backend is None:
            reasons.append(f"no usable cgroup hierarchy (confinement {self.mode}; needs "
                           f"{'/'.join(REQUIRED_CONTROLLERS)} writable by the agent)")
        if not self.users.enabled:
            reasons.append(f"jobs would run as {self.users.describe()} (needs the capabilities to switch users "
                           "and a job user that can reach data_dir: job_user, design §19.5)")
        return reasons

    def summary(self) -> str:
        """How jobs run here, in one line for the hello and the node page (design §19.6)."""
        reasons = self.unconfined_reasons()
        if reasons or self.backend is None:
            return "unconfined: " + "; ".join(reasons)
        return f"confined: {self.backend.name} cgroups, as {self.users.describe()}"

    @classmethod
    def from_config(cls, config: Any, data_dir: Path) -> Confiner:
        return cls(data_dir=data_dir, mode=config.confinement, cgroup_parent=config.cgroup_parent,
                   job_user=config.job_user, job_uid_base=config.job_uid_base, job_uid_count=config.job_uid_count,
                   memory_bytes_per_gpu=config.memory_bytes_per_gpu, cpu_cores_per_gpu=config.cpu_cores_per_gpu,
                   pids_max=config.job_pids_max)

    def limits_for(self, gpus: list[int], memory_bytes: Any = None, cpu_cores: Any = None) -> Limits:
        """The job's limits (design §19.2): the node's per-GPU defaults times its GPU count (at least one), lowered
        to what the start command asks (``memory_bytes``, ``cpu_cores``) when that is valid and smaller — a job
        may ask for less than the owner lends per GPU, never more. A node without a default takes the request
        as it is (the portal refuses requests under 256 MiB; the agent's own defaults may be smaller)."""
        per = max(1, len(gpus))
        node_mem = self.memory_bytes_per_gpu * per if self.memory_bytes_per_gpu else None
        node_cpu = self.cpu_cores_per_gpu * per if self.cpu_cores_per_gpu else None
        asked_mem = int(memory_bytes) if _positive(memory_bytes) and float(memory_bytes).is_integer() else None
        asked_cpu = float(cpu_cores) if _positive(cpu_cores) else None
        mem = min((v for v in (node_mem, asked_mem) if v is not None), default=None)
        cpu = min((v for v in (node_cpu, asked_cpu) if v is not None), default=None)
        return Limits(memory_bytes=mem, cpu_cores=cpu, pids_max=self.pids_max, gpus=tuple(gpus))

    def sweep(self) -> list[str]:
        """Kill and remove the job cgroups a predecessor left (its escaped processes included)."""
        if self.backend is None:
            return []
        left = self.backend.leftovers()
        for job_id in left:
            self.backend.remove_job(job_id)
        if left:
            log.warning("confinement: killed and removed %d job cgroup(s) a previous agent left: %s", len(left), left)
        self.backend.remove_parent_if_empty()
        return left

    def prepare_dirs(self) -> None:
        """``<data>``, ``<data>/jobs`` and ``<data>/ckpt`` searchable by job users but not listable (0711)."""
        for d in (self.data_dir, self.data_dir / "jobs", self.data_dir / "ckpt"):
            d.mkdir(parents=True, exist_ok=True)
            mode = d.stat().st_mode & 0o7777
            wanted = (mode | 0o711) & ~0o066 if d != self.data_dir else mode | 0o011
            if mode != wanted:
                os.chmod(d, wanted)

    def begin(self, job_id: str, limits: Limits, dirs: list[Path]) -> JobConfinement:
        """Confine job ``job_id``: its cgroup with ``limits``, its user, ``dirs`` owned by that user (0700)."""
        user = self.users.acquire(job_id)
        try:
            if user is not None:
                self.prepare_dirs()
                for d in dirs:
                    chown_tree(d, user.uid, user.gid)
                    os.chmod(d, 0o700)
                    # its parent stays the agent's (a job cannot swap its own directory for a symlink) and
                    # searchable, whatever the agent's umask made it
                    os.chmod(d.parent, (d.parent.stat().st_mode & 0o7777 | 0o711) & ~0o066)
            cgroup = self.backend.create(job_id, limits) if self.backend is not None else None
        except BaseException:
            self.users.release(job_id)
            raise
        env = {}
        if user is not None:
            env = {"HOME": str(dirs[0]), "USER": user.name, "LOGNAME": user.name}
        return JobConfinement(job_id=job_id, cgroup=cgroup, user=user, dirs=dirs, confiner=self, env=env)

    def backend_idle(self) -> None:
        """Called as a job's cgroup goes: the parent goes with the last one."""
        if self.backend is not None:
            self.backend.remove_parent_if_empty()


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and value == value \
        and value < 2**63
