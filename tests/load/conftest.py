"""Process helpers for the load tests: a whole portal deployment in subprocesses, driven over HTTP.

Each test builds its own deployment (its own SQLite file, or its own PostgreSQL database and Redis database
number), so it shares nothing with the rest of the suite, and stops only the processes it started, by PID
(SIGTERM, then SIGKILL after a timeout; ``harness.Proc.stop``). ``RECLAIMNET_LOAD_KEEP=1`` keeps the work
directory (logs of daphne, Celery, the agents) for a look afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest

from portal.celery import app as celery_app
from tests.e2e import harness

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
DEMO_PASSWORD = "reclaimnet-demo"
EXCEPTION_PREFIXES = ("django.db.utils.", "sqlite3.", "psycopg.", "celery.exceptions.", "ValueError", "KeyError",
                      "TypeError", "AttributeError", "RuntimeError", "AssertionError")


def _load_driver() -> ModuleType:
    """``scripts/loaddriver.py`` (a script, not a package) as the module ``loaddriver``."""
    if "loaddriver" in sys.modules:
        return sys.modules["loaddriver"]
    spec = importlib.util.spec_from_file_location("loaddriver", REPO / "scripts" / "loaddriver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["loaddriver"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


loaddriver = _load_driver()


def tickcampus() -> ModuleType:
    """``scripts/tickcampus.py`` (a campus of any size, written in bulk) as the module ``tickcampus``."""
    if "tickcampus" not in sys.modules:
        spec = importlib.util.spec_from_file_location("tickcampus", REPO / "scripts" / "tickcampus.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["tickcampus"] = module
        spec.loader.exec_module(module)
    return sys.modules["tickcampus"]

# Extra logins so six clients are not all one user: (username, lab, group). Two threads share each.
EXTRA_USERS = [("provider2", "Robotics Lab", None), ("researcher2", None, "Computer Vision Group")]
CREDENTIALS: dict[str, Any] = {
    "admin": {"username": "admin", "password": DEMO_PASSWORD},
    "researchers": [{"username": u, "password": DEMO_PASSWORD} for u in ("researcher", "researcher2")],
    "providers": [{"username": u, "password": DEMO_PASSWORD} for u in ("provider", "provider2")],
}
_USERS_SNIPPET = """
from django.contrib.auth import get_user_model
from portal.core.models import Provider, ResearchGroup
for username, lab, group in {users!r}:
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_password({password!r})
        user.save()
    if lab:
        Provider.objects.get(name=lab).members.add(user)
    if group:
        ResearchGroup.objects.get(name=group).members.add(user)
"""


def base_env(**overrides: str) -> dict[str, str]:
    """This process's environment without pytest's and the suite's database/broker, plus ``overrides``."""
    drop = ("PYTEST", "DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "RECLAIMNET_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({
        "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        "RECLAIMNET_TESTING": "1", "SECRET_KEY": secrets.token_urlsafe(50), "LOG_LEVEL": "WARNING",
        "RECLAIMNET_CONTROL_PERIOD_S": "1", "RECLAIMNET_HEARTBEAT_INTERVAL_S": "1",
        "RECLAIMNET_HEARTBEAT_TIMEOUT_S": "6",
    })
    env.update(overrides)
    return env


# The README's production workers: (queues, concurrency, name, niceness). One per queue group, as
# docs/design.md §10 asks; placement and the slow queues run at a lower CPU priority than daphne and the control
# worker (``nice -n 10``), so a burst of background work never takes the cores from the pages.
BACKGROUND_NICENESS = 10
PRODUCTION_WORKERS = [
    ("control", 2, "control", 0),
    ("tick", 1, "tick", 0),
    ("placement", 2, "placement", BACKGROUND_NICENESS),
    ("housekeeping,notifications,evaluation,default", 1, "slow", BACKGROUND_NICENESS),
]


PRODUCTION_PERIODS = {  # the settings' own defaults: base_env shortens them for the write tests
    "RECLAIMNET_CONTROL_PERIOD_S": "10", "RECLAIMNET_HEARTBEAT_INTERVAL_S": "2", "RECLAIMNET_HEARTBEAT_TIMEOUT_S": "10",
}


def production_env(database_url: str, redis_url: str) -> dict[str, str]:
    """``base_env`` as production runs: no RECLAIMNET_TESTING (real password hashing, the login lockout, the
    shared dashboard cache), default periods; plain HTTP on loopback (no TLS proxy here)."""
    env = base_env(DATABASE_URL=database_url, REDIS_URL=redis_url, RECLAIMNET_INSECURE_HTTP="1",
                   **PRODUCTION_PERIODS)
    env.pop("RECLAIMNET_TESTING", None)
    return env


@dataclass
class Deployment:
    """The processes of one portal deployment; only these are ever signalled."""

    workdir: Path
    env: dict[str, str]
    port: int = 0
    procs: list[harness.Proc] = field(default_factory=list)

    extra_ports: list[int] = field(default_factory=list)  # the other daphne processes of start_production

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_urls(self) -> list[str]:
        """Every daphne process's address (a reverse proxy would spread clients over them)."""
        return [self.base_url] + [f"http://127.0.0.1:{port}" for port in self.extra_ports]

    def manage(self, *args: str, timeout_s: float = 180) -> str:
        """``manage.py ARGS`` to completion; its output, or a failure showing it."""
        done = subprocess.run([PY, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            pytest.fail(f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def prepare(self) -> None:
        """Migrate, seed the campus with the demo logins (+ agent tokens) and add the extra load users."""
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("seed_campus", "--demo-users", "--agent-tokens", str(self.workdir / "tokens.json"))
        self.manage("shell", "-c", _USERS_SNIPPET.format(users=EXTRA_USERS, password=DEMO_PASSWORD))

    def spawn(self, name: str, argv: list[str]) -> harness.Proc:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:  # the child keeps its own descriptor
            popen = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        proc = harness.Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def start_daphne(self) -> harness.Proc:
        self.port = self.port or harness.free_port()
        self.env["CSRF_TRUSTED_ORIGINS"] = self.base_url
        proc = self.spawn("daphne", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                     "portal.asgi:application"])
        harness.wait_listening(proc, self.port, 60)
        return proc

    def start_celery(self, concurrency: int = 2) -> tuple[harness.Proc, harness.Proc]:
        """A prefork worker and a separate beat, as a production deployment runs them. Not waited for: call
        ``wait_celery`` (after starting daphne, so the three boot side by side)."""
        worker = self.spawn("celery-worker", [
            PY, "-m", "celery", "-A", "portal", "worker", "-P", "prefork", "--concurrency", str(concurrency),
            "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"load-{os.getpid()}@%h",
        ])
        beat = self.spawn("celery-beat", [PY, "-m", "celery", "-A", "portal", "beat", "-l", "INFO",
                                          "-s", str(self.workdir / "celerybeat-schedule")])
        return worker, beat

    def start_production(self, daphne_processes: int = 1, server: str = "daphne") -> None:
        """The README's production processes (``PRODUCTION_WORKERS``, beat, ``daphne_processes`` daphnes on ports
        of their own, as behind a reverse proxy), each as its command says; returns when every daphne listens and
        every worker is ready."""
        self.port = self.port or harness.free_port()
        self.extra_ports = [harness.free_port() for _ in range(daphne_processes - 1)]
        self.env["CSRF_TRUSTED_ORIGINS"] = ",".join(self.base_urls)
        for queues, concurrency, name, niceness in PRODUCTION_WORKERS:
            self.spawn(f"celery-{name}", [
                *(["nice", "-n", str(niceness)] if niceness else []),
                PY, "-m", "celery", "-A", "portal", "worker", "-Q", queues, "-c", str(concurrency),
                "-n", f"{name}-{os.getpid()}@%h", "--without-mingle", "--without-gossip", "-l", "INFO",
            ])
        self.spawn("celery-beat", [PY, "-m", "celery", "-A", "portal", "beat", "-l", "INFO",
                                   "-s", str(self.workdir / "celerybeat-schedule")])
        argv = {  # the HTTP server of each process: daphne (the README's), or uvicorn to compare
            "daphne": lambda port: [PY, "-m", "daphne", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=1024",
                                    "portal.asgi:application"],
            "uvicorn": lambda port: [PY, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--backlog",
                                     "1024", "--no-access-log", "--log-level", "warning", "portal.asgi:application"],
        }[server]
        daphnes = [(self.spawn(f"{server}-{port}" if port != self.port else server, argv(port)), port)
                   for port in [self.port, *self.extra_ports]]
        for daphne, port in daphnes:
            harness.wait_listening(daphne, port, 60)
        for proc in self.procs:
            if proc.name.startswith("celery-") and proc.name != "celery-beat":
                harness.wait_for(lambda p=proc: b"ready" in p.log_path.read_bytes() or not p.alive(), 60,
                                 what=f"{proc.name} ready")
        for proc in self.procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")

    def wait_celery(self) -> None:
        worker = next(p for p in self.procs if p.name == "celery-worker")
        harness.wait_for(lambda: b"ready" in worker.log_path.read_bytes() or not worker.alive(), 60,
                         what="celery worker ready")
        for proc in self.procs:
            if proc.name.startswith("celery") and not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")

    def start_agents(self, count: int) -> harness.Proc:
        """``manage.py demo_agents``: real agents (simulated GPUs) for the first ``count`` Vision Lab nodes."""
        proc = self.spawn("demo-agents", [
            PY, "manage.py", "demo_agents", "--count", str(count), "--portal", f"ws://127.0.0.1:{self.port}/ws/agent/",
            "--data-dir", str(self.workdir / "agents"), "--submit-jobs", "0",
        ])
        http = loaddriver.Http(self.base_url)
        loaddriver.api_login(http, "admin", DEMO_PASSWORD)

        def online() -> bool:
            if not proc.alive():
                raise RuntimeError(f"demo_agents exited:\n{proc.tail()}")
            body = http.get("/api/nodes/?state=online&limit=1000").json() or {}
            return int(body.get("count", 0)) >= count

        try:
            harness.wait_for(online, 60, interval_s=0.5, what=f"{count} agents online")
        finally:
            http.close()
        return proc

    def check_alive(self) -> None:
        """Fail naming any process of this deployment that is gone (-15: someone else's SIGTERM reached it)."""
        dead = [f"{p.name} (pid {p.popen.pid}) exited with {p.popen.returncode}" for p in self.procs if not p.alive()]
        if dead:
            pytest.fail("died during the run: " + ", ".join(dead) + f"\n{self.errors()}")

    def stop_all(self, timeout_s: float = 5.0) -> None:
        """SIGTERM each process (last started first), SIGKILL it after ``timeout_s``; say which needed that.
        Then the same for whatever they started and left behind (agents of a killed ``demo_agents``, jobs)."""
        for proc in reversed(self.procs):
            children = _descendants(proc.popen.pid)
            started = time.monotonic()
            proc.stop(timeout_s=timeout_s)
            if proc.popen.returncode == -signal.SIGKILL:
                print(f"{proc.name} (pid {proc.popen.pid}) ignored SIGTERM for {time.monotonic() - started:.1f} s: "
                      "SIGKILLed")
            _stop_leftovers(children, timeout_s)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each process of this deployment has used so far, its children included (a
        prefork worker's pool; Linux /proc, empty elsewhere)."""
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        out = {}
        for proc in self.procs:
            total = 0.0
            for pid in [proc.popen.pid, *_descendants(proc.popen.pid)]:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) * tick_s  # utime, stime
            out[proc.name] = total
        return out

    def errors(self, n_lines: int = 8) -> str:
        """The first ERROR lines (and the exception ending each traceback) of every process's log."""
        out = []
        for proc in self.procs:
            with contextlib.suppress(OSError):
                lines = proc.log_path.read_text(errors="replace").splitlines()
                picked = [ln for ln in lines if " ERROR" in ln or ln.startswith(EXCEPTION_PREFIXES)]
                if picked:
                    out.append(f"--- {proc.name} (pid {proc.popen.pid}): {len(picked)} error lines, log "
                               f"{proc.log_path} ---")
                    out += [ln[:300] for ln in picked[:n_lines]]
        return "\n".join(out)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> dict[int, str]:
    """{pid: command line} of every process below ``root`` (Linux /proc; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    parents.setdefault(ppid, []).append(int(entry))
    out: dict[int, str] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = _cmdline(pid)
        todo += parents.get(pid, [])
    return out


def _stop_leftovers(children: dict[int, str], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL, the processes in ``children`` still running the same command (not a reused PID)."""
    def alive() -> list[int]:
        return [pid for pid, cmd in children.items() if cmd and _cmdline(pid) == cmd]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = alive()
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = alive()
        if not left:
            return


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="reclaimnet-load-"))
    try:
        yield path
    finally:
        if os.environ.get("RECLAIMNET_LOAD_KEEP"):
            print(f"load-test logs kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


# --- counting duplicates after a run ------------------------------------------------------------------------------

NAME_COUNTS_SQL = ("SELECT 'job', name, COUNT(*) FROM core_job WHERE name LIKE {p} GROUP BY name "
                   "UNION ALL SELECT 'node', name, COUNT(*) FROM core_node WHERE name LIKE {p} GROUP BY name")


def name_counts_sqlite(path: Path, run: str) -> dict[tuple[str, str], int]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        rows = db.execute(NAME_COUNTS_SQL.format(p=":p"), {"p": f"load-{run}-%"}).fetchall()
    return {(kind, name): int(n) for kind, name, n in rows}


def name_counts_postgres(dsn: str, run: str) -> dict[tuple[str, str], int]:
    import psycopg

    with psycopg.connect(dsn) as db:
        rows = db.execute(NAME_COUNTS_SQL.format(p="%(p)s"), {"p": f"load-{run}-%"}).fetchall()
    return {(kind, name): int(n) for kind, name, n in rows}


OUTBOX_SQL = "SELECT task_name, available_at, sent_at FROM core_outboxmessage"


def _outbox_summary(rows: list[tuple[Any, Any, Any]]) -> str:
    """Backlog and relay lag (sent − available) of the transactional outbox, where the portal has one."""
    def when(value: Any) -> dt.datetime:
        return value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))

    lags = sorted((when(sent) - when(available)).total_seconds() for _, available, sent in rows if sent is not None)
    unsent = sum(1 for *_, sent in rows if sent is None)
    if not rows:
        return "outbox: empty"
    p50 = lags[len(lags) // 2] if lags else float("nan")
    return (f"outbox: {len(rows)} messages, {unsent} still unsent at the end; relay lag p50 {p50:.1f} s, "
            f"max {max(lags, default=float('nan')):.1f} s")


def outbox_sqlite(path: Path) -> str:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
            return _outbox_summary(db.execute(OUTBOX_SQL).fetchall())
    except sqlite3.OperationalError as exc:
        return f"outbox: none ({exc})"


def outbox_postgres(dsn: str) -> str:
    import psycopg

    try:
        with psycopg.connect(dsn) as db:
            return _outbox_summary(db.execute(OUTBOX_SQL).fetchall())
    except psycopg.errors.UndefinedTable as exc:
        return f"outbox: none ({str(exc).splitlines()[0]})"


def check_run(result: Any, total: int, counts: dict[tuple[str, str], int], deployment: Deployment) -> None:
    """0 server errors, 0 replay mismatches, 0 duplicate names, every answered create stored; the driver itself
    worked (no client gave up, nobody was refused as unauthorised, the writes really happened)."""
    report = result.report()
    duplicates = {k: n for k, n in counts.items() if n > 1}
    stored = {name for _, name in counts}
    missing = [name for name in result.names if name not in stored]
    answered = set(result.names)
    unseen = sorted(name for name in stored if name not in answered)  # stored, though the answer said otherwise
    problems = []
    if result.client_failures:
        problems.append(f"{len(result.client_failures)} clients gave up")
    if result.server_errors:
        problems.append(f"{result.server_errors} server errors")
    if result.replay_mismatches:
        problems.append(f"{result.replay_mismatches} replay mismatches")
    if duplicates:
        problems.append(f"{len(duplicates)} duplicated names, e.g. {sorted(duplicates.items())[:5]}")
    if unseen:
        problems.append(f"{len(unseen)} names stored although their create was not answered as a success "
                        f"(a 5xx after commit?), e.g. {unseen[:3]}")
    if missing:
        problems.append(f"{len(missing)} created names missing from the database, e.g. {missing[:5]}")
    refused = {s: result.statuses[s] for s in (401, 403, 404) if result.statuses.get(s)}
    if refused:
        problems.append(f"unexpected refusals (driver or permission bug): {refused}")
    if problems:
        pytest.fail("; ".join(problems) + f"\n{report}\n{deployment.errors()}")
    assert result.writes == total and len(result.names) > total // 10, report


# --- PostgreSQL and Redis of the production test ------------------------------------------------------------------

def _server_of(url: str, schemes: tuple[str, ...], default: str) -> str:
    """``scheme://user@host:port`` of the suite's ``url`` (``make test`` passes its servers), else ``default``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in schemes and parts.netloc else default


PG_SERVER = _server_of(os.environ.get("DATABASE_URL", ""), ("postgres", "postgresql"),
                       "postgres://reclaimnet@127.0.0.1:5432")
# Named after the suite's database (as tests/control/conftest.py names its test database): parallel runs on one
# server, each with its own DATABASE_URL, do not share it.
LOAD_DATABASE = f"test_{urlsplit(os.environ.get('DATABASE_URL', '')).path.lstrip('/') or 'reclaimnet'}_load"
REDIS_SERVER = _server_of(os.environ.get("REDIS_URL", ""), ("redis", "rediss"), "redis://127.0.0.1:6379")
# e2e uses 3, 4, 6, 9 and 10, bench_e2e 4, xdist workers 11-15, the suite 0; a parallel run names another with RECLAIMNET_LOAD_REDIS_DB.
LOAD_REDIS_DB = int(os.environ.get("RECLAIMNET_LOAD_REDIS_DB", "5"))
# kombu's Redis transport keeps a queue's messages of priority p > 0 under "<queue>\x06\x16<p>".
_PRIORITY_SUFFIXES = ("", *(f"\x06\x16{p}" for p in range(1, 10)))


def celery_keys() -> tuple[str, ...]:
    """The Redis keys of Celery's messages: every queue of the app's ``task_queues`` (control, tick, placement,
    … and the pre-routing "celery"), with its priority lists and binding, plus the unacked bookkeeping."""
    names = {"celery", *(queue.name for queue in celery_app.conf.task_queues or ())}
    keys = [f"{name}{suffix}" for name in sorted(names) for suffix in _PRIORITY_SUFFIXES]
    keys += [f"_kombu.binding.{name}" for name in sorted(names)]
    return (*keys, "unacked", "unacked_index", "unacked_mutex", "_kombu.binding.celery.pidbox",
            "_kombu.binding.celeryev")


def postgres_backends_cpu_s(database: str | None = None) -> dict[int, float]:
    """CPU seconds (user + system) each PostgreSQL backend connected to ``database`` (default: the load test's
    own) has used so far, by pid: the server's processes serve everyone on the machine, these serve only the
    deployment. Needs the server on this machine (Linux /proc); empty otherwise."""
    import psycopg

    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(psycopg.Error), psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True,
                                                             connect_timeout=5) as db:
        pids = [int(pid) for (pid,) in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database or LOAD_DATABASE,)).fetchall()]
        out = {}
        for pid in pids:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[pid] = (int(fields[11]) + int(fields[12])) * tick_s
        return out
    return {}


def cpu_used_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two :func:`postgres_backends_cpu_s` readings (a backend that started meanwhile
    counts from zero; one that ended is not seen)."""
    return sum(cpu_s - before.get(pid, 0.0) for pid, cpu_s in after.items())


def _pg_admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as db:
        db.execute(statement)


@contextlib.contextmanager
def own_postgres() -> Iterator[str]:
    """A database of our own (``LOAD_DATABASE``) on the suite's PostgreSQL server, dropped afterwards."""
    _pg_admin(f"DROP DATABASE IF EXISTS {LOAD_DATABASE} WITH (FORCE)")
    _pg_admin(f"CREATE DATABASE {LOAD_DATABASE}")
    try:
        yield f"{PG_SERVER}/{LOAD_DATABASE}"
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {LOAD_DATABASE} WITH (FORCE)")


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """Redis database ``LOAD_REDIS_DB`` of the suite's server, with Celery's queue keys dropped before and
    after."""
    import redis

    url = harness.redis_db(REDIS_SERVER, LOAD_REDIS_DB)
    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
        client.delete(*celery_keys())
        yield url
    finally:
        with contextlib.suppress(redis.RedisError):
            client.delete(*celery_keys())
        client.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    try:
        manager = own_postgres()
        url = manager.__enter__()
    except Exception as exc:  # no server, no CREATEDB right: the embedded test still runs
        pytest.skip(f"no PostgreSQL for the load test at {PG_SERVER}: {exc}")
    try:
        yield url
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture
def redis_url() -> Iterator[str]:
    import redis

    try:
        manager = own_redis()
        url = manager.__enter__()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis for the load test at {REDIS_SERVER}: {exc}")
    try:
        yield url
    finally:
        manager.__exit__(None, None, None)
