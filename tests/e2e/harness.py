"""Process harness for end-to-end runs: daphne, a Celery worker (+ beat), node agents, all on loopback.

Used by tests/e2e and scripts/bench_e2e.py. Only processes started here are ever signalled, by their PID.
Django must already be configured (with the database the subprocesses will use) before ``make_campus``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAIN = "python examples/train_numpy.py"
# The same trainer run through tests/chaos/steplog.py, which appends every step it executes to a ledger file
# (the ground truth of work done and redone; tests/chaos).
TRAIN_LOGGED = "python tests/chaos/steplog.py --ledger {ledger} --"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SIGKILL = signal.SIGKILL  # (inside Proc, ``signal`` is its method)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_db(url: str, db: int) -> str:
    """The same Redis server, another database number (isolates e2e queues from other users of db 0)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


def stack_database_url() -> str:
    """The URL of the test database pytest-django created, for the stack's processes (refuses any other)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if not str(db["NAME"]).startswith("test_"):
        raise RuntimeError("refusing to run e2e on a non-test database (no django_db test collected?)")
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.1, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what or predicate}")
        time.sleep(interval_s)


def wait_listening(proc: Proc, port: int, timeout_s: float) -> None:
    """Wait until ``proc`` accepts connections on ``port``; fail at once, with its log, if it exits."""

    def up() -> bool:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        return False

    wait_for(up, timeout_s, what=f"{proc.name} to listen on {port}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(5)

    def children(self) -> list[int]:
        """PIDs of this process's direct children (a prefork worker's pool), read from /proc."""
        out: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.popen.pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    out += [int(p) for p in (task / "children").read_text().split()]
        return out

    def kill_tree(self, sig: int = SIGKILL) -> None:
        """Signal the children first (they were started by this process, checked via /proc), then the process."""
        for pid in self.children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        self.signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def tail(self, n_lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n_lines:])
        return ""


@dataclass
class Stack:
    """Portal (daphne), worker (Celery + embedded beat) and agents for one end-to-end run."""

    workdir: Path
    database_url: str
    redis_url: str
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 2.0
    control_period_s: float = 1.0
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update({
            "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url, "RECLAIMNET_TESTING": "1",
            "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
            "RECLAIMNET_HEARTBEAT_INTERVAL_S": str(self.heartbeat_interval_s),
            "RECLAIMNET_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
            "RECLAIMNET_CONTROL_PERIOD_S": str(self.control_period_s),
            "LOG_LEVEL": "INFO",
        })
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"{name}.log"
        fh = open(log_path, "ab")  # noqa: SIM115  (the child owns it)
        try:
            popen = subprocess.Popen(argv, cwd=REPO, env=env or self.env(), stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        finally:
            fh.close()
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        return proc

    @property
    def portal_ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

    def flush_redis(self) -> None:
        """Drop stale Celery messages from earlier runs (only the queue keys, not the whole database)."""
        import redis
        from django.conf import settings

        client = redis.Redis.from_url(self.redis_url)
        queues = [q.name for q in getattr(settings, "CELERY_TASK_QUEUES", [])] or ["celery"]
        client.delete(*queues, "celery", "unacked", "unacked_index", "unacked_mutex")

    def start_portal(self, name: str = "daphne", port: int | None = None) -> Proc:
        """A daphne process (``name``, ``port``: a second one beside the first, as a portal of several processes
        runs them, design §18; by default the stack's own port)."""
        if port is None:
            self.port = port = self.port or free_port()
        # As the README's production command: a listen backlog for bursts (Twisted's default is 50).
        proc = self._spawn(name, [PY, "-m", "daphne", "-e",
                                  f"tcp:port={port}:interface=127.0.0.1:backlog=1024",
                                  "portal.asgi:application"])
        wait_listening(proc, port, 30)
        return proc

    def start_worker(self, name: str = "celery", *, beat: bool = True, pool: str = "solo",
                     concurrency: int = 1, extra_args: tuple[str, ...] = ()) -> Proc:
        """A Celery worker (``-B``: with beat and the outbox relay inside it). ``name`` is also its node name,
        so several workers can run side by side as on separate hosts."""
        argv = [PY, "-m", "celery", "-A", "portal", "worker", "-P", pool, "--concurrency", str(concurrency),
                "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
                *extra_args]
        if beat:
            argv += ["-B", "-s", str(self.workdir / "celerybeat-schedule")]
        proc = self._spawn(name, argv)
        wait_for(lambda: b"ready" in proc.log_path.read_bytes() or not proc.alive(), 30, what=f"{name} ready")
        if not proc.alive():
            raise RuntimeError(f"{name} exited:\n{proc.tail()}")
        return proc

    def start_beat(self) -> Proc:
        """Celery beat on its own (the control tick and the outbox relay), as the production setup runs it."""
        proc = self._spawn("beat", [PY, "-m", "celery", "-A", "portal", "beat", "-l", "INFO",
                                    "-s", str(self.workdir / "celerybeat-schedule")])
        wait_for(lambda: b"outbox relay started" in proc.log_path.read_bytes() or not proc.alive(), 30,
                 what="beat and its outbox relay")
        if not proc.alive():
            raise RuntimeError(f"beat exited:\n{proc.tail()}")
        return proc

    def start_agent(self, name: str, token: str, gpus: int = 2, via: CuttableLink | None = None,
                    portals: list[str] | None = None) -> Proc:
        """An agent (``via``: reaching the portal through that link, which a test can cut; ``portals``: every
        daphne's address, tried in turn, design §18)."""
        data_dir = self.workdir / "agents" / name
        data_dir.mkdir(parents=True, exist_ok=True)
        self.procs.pop(f"agent-{name}", None)
        portal = f"ws://127.0.0.1:{via.port}/ws/agent/" if via is not None else self.portal_ws
        portal_args = [arg for url in (portals or [portal]) for arg in ("--portal", url)]
        return self._spawn(f"agent-{name}", [  # the token goes in the environment, never on a command line
            PY, "-m", "nodeagent", *portal_args, "--data-dir", str(data_dir),
            "--simulate-gpus", str(gpus), "--base-dir", str(REPO),
            # its data_dir is under a 0700 temporary directory no job user can reach (design §19.5)
            "--allow-unconfined-jobs",
        ], env={**self.env(), "RECLAIMNET_AGENT_TOKEN": token})

    def agent_dir(self, name: str) -> Path:
        return self.workdir / "agents" / name

    def inject_faults(self, name: str, corrupt: int = 0, truncate: int = 0, classes: tuple[str, ...] = ()) -> None:
        """Make the agent's next sends fail (test-only hook, see nodeagent.transfer.Faults)."""
        path = self.agent_dir(name) / "faults.json"
        path.write_text(json.dumps({"corrupt": corrupt, "truncate": truncate, "classes": list(classes)}))

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()


def use_broker(url: str) -> Callable[[], None]:
    """Point this process's Celery producer at ``url`` (the stack's worker); returns a function undoing it."""
    from portal.celery import app

    old = app.conf.broker_url
    old_eager = app.conf.task_always_eager

    def _switch(to: str, eager: bool = False) -> None:
        app.conf.task_always_eager = eager  # tasks must reach the stack's worker, not run in this process
        app.conf.broker_url = to
        # The connection pool and the producer pool built on it cache connections to the old broker.
        if app._pool is not None:
            app._pool.force_close_all()
            app._pool = None
        app.amqp._producer_pool = None

    _switch(url)
    return lambda: _switch(old, old_eager)


def make_campus(node_names: list[tuple[str, str]], gpus_per_node: int = 2,
                access_bytes_per_s: float = 125e6) -> dict[str, tuple[int, str]]:
    """Create a two-building campus (core, building switches, uplinks) and register the nodes.

    ``node_names``: (node name, building code). Returns {name: (node id, raw agent token)}.
    """
    from portal.core.models import Building, Link, Provider, Switch
    from portal.core.services.nodes import register_node

    provider, _ = Provider.objects.get_or_create(slug="e2e-lab", defaults={"name": "E2E Lab"})
    core, _ = Switch.objects.get_or_create(name="e2e-core", defaults={"tier": Switch.Tier.CORE})
    out = {}
    for name, code in node_names:
        building, _ = Building.objects.get_or_create(name=f"E2E {code}")
        switch, created = Switch.objects.get_or_create(name=f"e2e-sw-{code}",
                                                       defaults={"tier": Switch.Tier.BUILDING, "building": building})
        if created:
            Link.objects.create(name=f"e2e-up-{code}", kind=Link.Kind.UPLINK, upper=core, lower_switch=switch,
                                capacity_bytes_per_s=1.25e9)
        node, token = register_node(None, provider=provider, building=building, name=name,
                                    gpus=[{"model": "RTX 3090"}] * gpus_per_node,
                                    access_link_bytes_per_s=access_bytes_per_s)
        out[name] = (node.pk, token)
    return out


def submit_training_job(name: str, steps: int, step_sleep_s: float, pad_bytes: int = 0, loss_budget_s: float = 1.0,
                        restart_s: float = 1.0, ledger: Path | None = None) -> int:
    """Queue the deterministic numpy job through the core service (the control plane places it).

    ``ledger``: run the trainer through tests/chaos/steplog.py, which appends every executed step there."""
    from django.contrib.auth import get_user_model

    from portal.core.models import ResearchGroup
    from portal.core.services.jobs import submit_job

    group, _ = ResearchGroup.objects.get_or_create(slug="e2e-group", defaults={"name": "E2E Group"})
    user, _ = get_user_model().objects.get_or_create(username="e2e")
    group.members.add(user)
    job = submit_job(user, group=group, name=name, gpu_count=1, expected_runtime_s=max(1.0, steps * step_sleep_s),
                     ckpt_bytes_estimate=max(1, pad_bytes + 4096),
                     command=training_command(steps, step_sleep_s, pad_bytes, ledger),
                     loss_budget_s=loss_budget_s, restart_s=restart_s)
    return job.pk


def training_command(steps: int, step_sleep_s: float, pad_bytes: int, ledger: Path | None = None) -> str:
    """The trainer's command line (recording its steps to ``ledger`` when given)."""
    prefix = TRAIN_LOGGED.format(ledger=ledger) if ledger is not None else TRAIN
    return f"{prefix} --steps {steps} --step-sleep {step_sleep_s} --pad-bytes {pad_bytes}"


def reference_weights(steps: int, pad_bytes: int, workdir: Path) -> str:
    """The final-weights sha256 of an uninterrupted run (no agent, no sleep)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RECLAIMNET_CKPT_DIR": str(workdir / "ckpt")}
    subprocess.run([PY, str(REPO / "examples" / "train_numpy.py"), "--steps", str(steps), "--pad-bytes",
                    str(pad_bytes), "--result", str(workdir / "result.json")], check=True, env=env, cwd=workdir,
                   capture_output=True)
    return str(json.loads((workdir / "result.json").read_text())["weights_sha256"])


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the ``postgres`` user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


class PrivatePostgres:
    """A PostgreSQL cluster of one run's own (``initdb`` in ``workdir``, trust auth, a spare port), so that
    restarting it disturbs no other user of the machine's server. Only its own postmaster is ever signalled
    (through ``pg_ctl -D`` of its own data directory)."""

    def __init__(self, workdir: Path, user: str = "reclaimnet", database: str = "reclaimnet") -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data_dir = workdir / "pgdata"
        self.log_path = workdir / "postgres.log"
        self.user = user
        self.database = database

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str, timeout_s: float = 120) -> None:
        done = subprocess.run(_as_postgres([*argv]), capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv[:2])} exited {done.returncode}: {done.stdout}{done.stderr}")

    def init(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # the postgres user must reach its directory (mkdtemp makes parents 0700)
            for parent in self.workdir.parents:
                if parent == Path(tempfile.gettempdir()):
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
            shutil.chown(self.workdir, "postgres")
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        self.start()
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                  self.database)

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


class PrivateRedis:
    """A redis-server of one run's own on a spare port, nothing kept on disk."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--dir", str(self.workdir)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def pings() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
            return False

        wait_for(pings, 15, what="private redis")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


class CuttableLink:
    """A loopback TCP relay in front of the portal for one agent, which a test can cut and heal.

    Cut, it stops moving bytes both ways and holds new connections silent, closing nothing: to both ends that
    is a network partition (no FIN, no RST, only silence; TCP's buffers fill and the sender stalls). Healed, it
    moves what was held, as TCP does when a partition heals before either side gave the connection up. The
    agent process runs on meanwhile (its timers, its jobs), unlike a stopped one; peer-to-peer checkpoint
    copies do not go through it (the cut is between the node and the portal)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = False
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True, name=f"link-{self.port}").start()

    def cut(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def retarget(self, target_port: int) -> None:
        """New connections go to ``target_port`` (a portal restarted on another port)."""
        self.target_port = target_port

    def close(self) -> None:
        self.closed = True
        self.flowing.set()
        with contextlib.suppress(OSError):
            self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.flowing.wait()  # a connection made during a cut stays silent until it heals
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), 10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed:
                data = src.recv(65536)
                self.flowing.wait()  # cut: hold this chunk, read nothing more
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
