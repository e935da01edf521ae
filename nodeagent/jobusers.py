"""Job users (design §19.5, §19.6): whether the agent may run jobs as other users, which user each job gets
(a named one or one uid per job), whether that user can reach a directory, and handing a job's directories to it
and back without following a link. ``nodeagent.confine`` re-exports these names."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from nodeagent.config import ConfigError

log = logging.getLogger("nodeagent.confine")  # the confinement's log, as before the split

DEFAULT_JOB_USER = "nobody"
# What a non-root agent needs to run jobs as other users (design §19.5, §19.6): change the child's ids, hand the
# job's directories over and back, reach into them while the job owns them (0700), and signal its processes.
SWITCH_USER_CAPABILITIES = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_KILL": 5, "CAP_SETGID": 6,
                            "CAP_SETUID": 7}


def can_switch_users() -> bool:
    """Whether this process may change a child's user and chown its directories (root, or the capabilities)."""
    if os.geteuid() == 0:
        return True
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        eff = int(next(line.split()[1] for line in status if line.startswith("CapEff:")), 16)
        return all(eff >> bit & 1 for bit in SWITCH_USER_CAPABILITIES.values())
    return False


def unreachable(path: Path, uid: int, gids: set[int]) -> Path | None:
    """The first directory on the way to ``path`` (itself included) that ``uid`` may not search (None: all may).
    Mode bits only (as the kernel checks them without ACLs)."""
    p = path.resolve()
    for d in [*reversed(p.parents), p]:
        try:
            st = d.stat()
        except OSError:
            return d
        if uid == 0:
            continue
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid in gids else stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int
    name: str


class UserPolicy:
    """Which user a job runs as: one configured user for every job, or one uid per job slot (``job_uid_base`` +
    slot, so no two running jobs share a uid), or the agent's own user (not root, or switched off)."""

    def __init__(self, job_user: str | None, uid_base: int | None, uid_count: int) -> None:
        self.job_user = job_user
        self.uid_base = uid_base
        self.uid_count = uid_count
        self.slots: dict[str, int] = {}  # job id → slot while it runs
        self.user: JobUser | None = None
        self.enabled = False

    def resolve(self, data_dir: Path, explicit: bool) -> None:
        """Decide once, at start: logs why users are not switched; raises ConfigError naming ``job_user`` when an
        explicitly configured user cannot reach ``data_dir`` (its parents: the agent opens ``data_dir`` itself)."""
        if self.job_user == "":
            log.info("confinement: job_user is \"\": jobs run as the agent's user")
            return
        if not can_switch_users():
            log.info("confinement: the agent is not root (needs %s): jobs run as the agent's user %s; job_user and "
                     "job_uid_base are not applied", "/".join(SWITCH_USER_CAPABILITIES), pwd.getpwuid(os.geteuid())[0])
            return
        name = self.job_user or DEFAULT_JOB_USER
        if self.uid_base is not None:  # per-job uids: no passwd entry needed (nor wanted)
            self.user = JobUser(self.uid_base, self.uid_base, f"uid{self.uid_base}")
        else:
            try:
                entry = pwd.getpwnam(name)
            except KeyError as exc:
                if explicit:
                    raise ConfigError(f"job_user: no such user {name!r}") from exc
                log.warning("confinement: user %r does not exist: jobs run as the agent's user", name)
                return
            self.user = JobUser(entry.pw_uid, entry.pw_gid, name)
        blocked = unreachable(data_dir.resolve().parent, self.user.uid, {self.user.gid})
        if blocked is not None:
            where = f"{str(blocked)!r} is missing"
            with contextlib.suppress(OSError):
                where = f"{str(blocked)!r} is mode {blocked.stat().st_mode & 0o7777:04o}"
            field = "job_uid_base" if self.uid_base is not None else "job_user"
            message = (f"{field}: uid {self.user.uid} cannot reach data_dir {str(data_dir)!r}: {where} (every "
                       f"parent directory needs search permission for it)")
            if explicit:
                raise ConfigError(message)
            log.warning("confinement: %s; jobs run as the agent's user (set job_user to choose)", message)
            self.user = None
            return
        interpreter = Path(sys.executable).resolve()  # what ``python`` in a job command becomes (runner)
        if unreachable(interpreter.parent, self.user.uid, {self.user.gid}) is not None:
            if not explicit:  # the default user must not make every python job fail to start
                log.warning("confinement: uid %d cannot run %s (a parent directory is closed to it): jobs run as "
                            "the agent's user (install the agent where others may read it, or set job_user)",
                            self.user.uid, interpreter)
                self.user = None
                return
            log.warning("confinement: uid %d cannot run %s (a parent directory is closed to it): jobs whose command "
                        "starts with python will not start; install the agent where others may read it",
                        self.user.uid, interpreter)
        self.enabled = True
        log.info("confinement: jobs run as %s", self.describe())

    def describe(self) -> str:
        """Who jobs run as, in words ("user nobody (uid 65534)", "uids 70000..70255, one per running job")."""
        if not self.enabled or self.user is None:
            try:
                return f"the agent's own user {pwd.getpwuid(os.geteuid())[0]}"
            except KeyError:
                return f"the agent's own uid {os.geteuid()}"
        if self.uid_base is not None:
            return f"uids {self.uid_base}..{self.uid_base + self.uid_count - 1}, one per running job"
        return f"user {self.user.name} (uid {self.user.uid})"

    def acquire(self, job_id: str) -> JobUser | None:
        if not self.enabled or self.user is None:
            return None
        if self.uid_base is None:
            return self.user
        if job_id not in self.slots:
            used = set(self.slots.values())
            free = next((s for s in range(self.uid_count) if s not in used), None)
            if free is None:
                raise RuntimeError(f"job_uid_count: all {self.uid_count} job uids are in use")
            self.slots[job_id] = free
        uid = self.uid_base + self.slots[job_id]
        return JobUser(uid, uid, f"uid{uid}")

    def release(self, job_id: str) -> None:
        self.slots.pop(job_id, None)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Own ``root`` and everything under it by ``uid``:``gid`` without following links (a job may plant a link
    to a file it must not own, or swap a directory for a link while the walk runs).

    The walk goes by directory descriptors (``os.fwalk``: each directory opened relative to its parent's
    descriptor and checked to be the directory that was listed) and every entry is changed relative to its
    directory's descriptor without following it, so no path is ever resolved through a name a job controls.
    Handing a tree to a job, ``root`` changes owner last (no job may rename inside it while the walk runs);
    taking one back, first (the job loses it before the walk)."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        taking_back = uid == os.geteuid()
        if taking_back:
            os.fchown(root_fd, uid, gid)
        for _dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd, follow_symlinks=False):
            for name in dirnames + filenames:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        if not taking_back:
            os.fchown(root_fd, uid, gid)
    finally:
        os.close(root_fd)
