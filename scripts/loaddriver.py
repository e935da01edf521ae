"""Load driver for a running portal: concurrent mixed writes (``writes``) and read latencies (``reads``).

Standard library only (threads + http.client), so it runs against any portal from any checkout. Used by
``tests/load`` (imported as a module) and from the command line:

    python scripts/loaddriver.py writes --base http://127.0.0.1:8000 --total 1000 --clients 6 \
        --credentials '{"admin": {"username": "admin", "password": "reclaimnet-demo"},
                        "researchers": [{"username": "researcher", "password": "reclaimnet-demo"}],
                        "providers": [{"username": "provider", "password": "reclaimnet-demo"}]}'
    python scripts/loaddriver.py reads --base http://127.0.0.1:8000 --clients 100 --duration 60 --think 1 \
        --credentials FILE

``--credentials`` is the JSON itself or the path of a file holding it. The last line printed is the summary:
``writes: N requests, E server errors, D replay mismatches`` or ``load: N requests, E errors, p50 A ms, p99 B ms``;
the exit status is 1 when it reports any server error, replay mismatch or (reads) error.

Writes. Clients are threads; client ``i`` is a researcher when ``i % 3 == 0`` and a provider otherwise (so 6
clients are 2 researchers and 4 providers and the six kinds of write come out roughly even), each logged in both
with an API token (``POST /api/auth/token/``) and with a browser session (the ``/accounts/login/`` form). Several
clients may share one user.

- researchers: submit a job (``POST /api/jobs/`` or the ``/jobs/new/`` form) and cancel one of the jobs this
  client submitted (``POST /api/jobs/{id}/cancel/`` or ``/jobs/<id>/cancel/``), half and half;
- providers: reclaim one of their lab's nodes (API scheduled ``/api/nodes/{id}/reclaim/``, API
  ``/emergency-reclaim/`` or the web ``/provider/nodes/<id>/reclaim/emergency/``), lend one again (API
  ``/lend-again/`` or web ``/provider/nodes/<id>/lend-again/``), register a node (``POST /api/nodes/``) and change
  node settings (``PATCH /api/nodes/{id}/`` or the web ``/provider/nodes/<id>/settings/`` form), a quarter each.

Every API create (jobs, nodes, reclaims) carries a fresh ``Idempotency-Key``; about 10 % are sent a second time
with the same key and body (a client retry) and the retry must answer the same status and JSON body, else it is
a replay mismatch (checked only when the first answer was a success: design §8 keeps no key for a refusal or
a server error, so their retry is a new attempt). A web job submit carries the form's
hidden ``submit_token`` when the form has one, and then about 10 % are posted twice. Every job and node gets a
unique name ``load-<run>-<client>-<n>`` so duplicates can be counted afterwards by name. Answers 400/409 are
what concurrency produces (reclaiming a node another client just reclaimed) and are only counted; 5xx answers
and connection errors are server errors.

Reads (``run_reads``; ``make load`` drives them with ``tests/load/run_load.py``). Closed-loop clients: each
sends a request, waits for the answer, thinks (uniform in [0.5, 1.5] × ``--think`` seconds; 0 = none), repeats.
Client ``i`` is an admin, a researcher or a provider in turn and picks its reads from ``READ_MIX`` (lists and
details of jobs and nodes, reclaims, the summary, the dashboard page, its summary fragment and chart data, the
provider and researcher pages). Each user logs in once, before the clock starts; its clients share the token and
the session. ``run_submit_burst`` sends N job submits at one instant. An error is any answer but 200 (201 for a
submit), or none.

The ``messages`` cookie (Django's flash messages) is not sent back: redirects are not followed, and a browser
that never showed them would otherwise grow the cookie (then the session) with every write.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loadhttp sits beside this script
from loadhttp import Answer, Http, api_login, parse_forms, web_login

RETRY_SHARE = 0.10
SAMPLES = 12
JOB_COMMAND = "python examples/train_numpy.py --steps 40 --step-sleep 0.05"
GPU_MODELS = ["RTX 3090", "RTX 4090", "A100", "RTX A6000"]
_ID_IN_PATH = re.compile(r"/(\d+)/?$")


# --- results -----------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


@dataclass
class WriteResult:
    run: str = ""
    writes: int = 0  # logical writes performed (a retried create counts once)
    requests: int = 0  # every HTTP request sent, logins, form GETs and retries included
    statuses: Counter[int] = field(default_factory=Counter)
    by_op: dict[str, Counter[int]] = field(default_factory=dict)
    web_outcomes: Counter[str] = field(default_factory=Counter)  # "web_cancel ok", "web_lend_again refused"
    server_errors: int = 0
    samples: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # jobs and nodes the portal said it created
    attempted_names: list[str] = field(default_factory=list)
    retries: int = 0  # API creates sent twice with one Idempotency-Key
    double_posts: int = 0  # web submits posted twice with one submit_token
    replay_mismatches: int = 0
    mismatch_samples: list[str] = field(default_factory=list)
    skipped_double_posts: int = 0  # the form had no submit_token: not double-posted
    elapsed_s: float = 0.0
    client_failures: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)  # of every request

    def percentile(self, q: float) -> float:
        return _percentile(self.latencies_ms, q)

    def summary(self) -> str:
        return (f"writes: {self.requests} requests, {self.server_errors} server errors, "
                f"{self.replay_mismatches} replay mismatches")

    def report(self) -> str:
        lines = [self.summary(),
                 f"  run {self.run}: {self.writes} writes in {self.elapsed_s:.1f} s, {self.retries} API retries, "
                 f"{self.double_posts} web double posts ({self.skipped_double_posts} skipped: no submit_token); "
                 f"latency p50 {self.percentile(50):.0f} ms, p99 {self.percentile(99):.0f} ms, "
                 f"max {max(self.latencies_ms, default=0):.0f} ms",
                 "  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))]
        for op, counts in sorted(self.by_op.items()):
            lines.append(f"  {op}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        if self.web_outcomes:
            lines.append("  web redirects: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.web_outcomes.items())))
        lines += [f"  server error: {s}" for s in self.samples]
        lines += [f"  replay mismatch: {s}" for s in self.mismatch_samples]
        lines += [f"  client failed: {s}" for s in self.client_failures]
        return "\n".join(lines)


class _Recorder:
    """Thread-safe accumulation into a WriteResult."""

    def __init__(self, result: WriteResult) -> None:
        self.result = result
        self.lock = threading.Lock()

    def __call__(self, op: str, method: str, path: str, ans: Answer) -> None:
        with self.lock:
            r = self.result
            r.requests += 1
            r.latencies_ms.append(ans.ms)
            r.statuses[ans.status] += 1
            r.by_op.setdefault(op, Counter())[ans.status] += 1
            if ans.status == 0 or ans.status >= 500:
                r.server_errors += 1
                if len(r.samples) < SAMPLES:
                    text = ans.error or ans.body[:300].decode("utf-8", "replace")
                    r.samples.append(f"{method} {path} {ans.status} {' '.join(text.split())}")

    def outcome(self, op: str, ans: Answer, http: Http) -> None:
        """What a web write's redirect meant, from its flash message: ok (success) or refused (error)."""
        if ans.status not in (301, 302, 303):
            return
        levels = http.last_levels
        what = "refused" if any(lv >= 40 for lv in levels) else "ok" if levels else "no message"
        with self.lock:
            self.result.web_outcomes[f"{op} {what}"] += 1

    def write(self) -> None:
        with self.lock:
            self.result.writes += 1

    def created(self, name: str) -> None:
        with self.lock:
            self.result.names.append(name)

    def attempted(self, name: str) -> None:
        with self.lock:
            self.result.attempted_names.append(name)

    def count(self, attr: str) -> None:
        with self.lock:
            setattr(self.result, attr, getattr(self.result, attr) + 1)

    def mismatch(self, text: str) -> None:
        with self.lock:
            self.result.replay_mismatches += 1
            if len(self.result.mismatch_samples) < SAMPLES:
                self.result.mismatch_samples.append(text)

    def failed(self, text: str) -> None:
        with self.lock:
            self.result.client_failures.append(text)


# --- the write clients -----------------------------------------------------------------------------------------


def _user_list(credentials: dict[str, Any], role: str) -> list[tuple[str, str]]:
    users = credentials.get(role) or []
    if isinstance(users, dict):
        users = [users]
    out = []
    for u in users:
        if isinstance(u, dict):
            out.append((str(u["username"]), str(u["password"])))
        else:
            out.append((str(u[0]), str(u[1])))
    return out


def _same(first: Answer, second: Answer) -> bool:
    if first.status != second.status:
        return False
    a, b = first.json(), second.json()
    if a is None and b is None:
        return first.body == second.body
    return bool(a == b)


class _Client:
    def __init__(self, index: int, role: str, user: tuple[str, str], base_url: str, run: str,
                 rec: _Recorder, rng: random.Random) -> None:
        self.index, self.role, self.user, self.run, self.rec, self.rng = index, role, user, run, rec, rng
        self.api = Http(base_url)
        self.web = Http(base_url)
        self.n = 0
        self.jobs: list[int] = []  # jobs this client created and has not cancelled
        self.nodes: dict[int, str] = {}  # node id -> believed state ("up" | "reclaimed")
        self.buildings: list[int] = []
        self.groups: list[str] = []
        self.settings_fields: list[tuple[str, str]] | None = None

    # helpers
    def name(self) -> str:
        self.n += 1
        name = f"load-{self.run}-c{self.index}-{self.n}"
        self.rec.attempted(name)
        return name

    def req(self, op: str, http: Http, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> Answer:
        if method == "GET":
            ans = http.get(path)
        elif isinstance(body, list):
            ans = http.post_form(path, body)
        else:
            ans = http.post_json(path, body if body is not None else {}, headers, method=method)
        self.rec(op, method, path, ans)
        return ans

    def create(self, op: str, path: str, payload: Any) -> Answer:
        """An API create with a fresh Idempotency-Key; ~10 % are retried with the same key and body."""
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        first = self.req(op, self.api, "POST", path, payload, headers)
        if self.rng.random() < RETRY_SHARE:
            self.rec.count("retries")
            second = self.req(op + "_retry", self.api, "POST", path, payload, headers)
            # Design §8: a success is stored and replayed; a refusal (4xx) keeps no key, so the retry is a new
            # attempt and may succeed once the state changed (a node lent again meanwhile).
            if 200 <= first.status < 300 and not _same(first, second):
                self.rec.mismatch(f"POST {path} first {first.status} {first.body[:150]!r} / retry "
                                  f"{second.status} {second.body[:150]!r}")
        return first

    def setup(self) -> None:
        username, password = self.user
        api_login(self.api, username, password, self.rec)
        web_login(self.web, username, password, self.rec)
        if self.role == "provider":
            ans = self.req("list_nodes", self.api, "GET", "/api/nodes/?mine=1&limit=1000")
            body = ans.json() or {}
            for node in body.get("results", body if isinstance(body, list) else []):
                self.nodes[int(node["id"])] = "reclaimed" if node["state"] == "reclaimed" else "up"
            ans = self.req("list_buildings", self.api, "GET", "/api/campus/buildings/?limit=1000")
            body = ans.json() or {}
            self.buildings = [int(b["id"]) for b in body.get("results", body if isinstance(body, list) else [])]

    def step(self) -> None:
        if self.role == "researcher":
            if self.jobs and self.rng.random() < 0.5:
                self.cancel()
            else:
                self.submit()
        else:
            op = self.rng.choice(["reclaim", "lend_again", "register", "settings"])
            if op == "reclaim":
                self.reclaim()
            elif op == "lend_again":
                self.lend_again()
            elif op == "register" or not self.nodes:
                self.register()
            else:
                self.settings()
        self.rec.write()

    # researcher writes
    def submit(self) -> None:
        name = self.name()
        if self.rng.random() < 0.5:
            payload = {"name": name, "gpu_count": 1, "expected_runtime_s": 60.0, "ckpt_bytes_estimate": 4096,
                       "command": JOB_COMMAND, "loss_budget_s": 10.0, "restart_s": 1.0}
            ans = self.create("api_submit", "/api/jobs/", payload)
            body = ans.json()
            if ans.status == 201 and isinstance(body, dict):
                self.jobs.append(int(body["id"]))
                self.rec.created(name)
            return
        page = self.req("web_submit_form", self.web, "GET", "/jobs/new/")
        forms = [f for f in parse_forms(page.body) if "name" in f.names() and "gpu_count" in f.names()]
        if page.status != 200 or not forms:
            return
        form = forms[0]
        fields = form.with_values({"name": name, "gpu_count": "1", "vram_gb_per_gpu": "0", "min_capability": "0",
                                   "command": JOB_COMMAND, "image": "", "expected_runtime_h": "0.02",
                                   "ckpt_gb": "0.001", "loss_budget_min": "0.5", "restart_s": "1"})
        ans = self.req("web_submit", self.web, "POST", "/jobs/new/", fields)
        self.rec.outcome("web_submit", ans, self.web)
        if self.rng.random() < RETRY_SHARE:
            if "submit_token" in form.names():
                self.rec.count("double_posts")
                again = self.req("web_submit_double", self.web, "POST", "/jobs/new/", fields)
                if ans.status == again.status == 302 and ans.location != again.location:
                    self.rec.mismatch(f"POST /jobs/new/ twice: redirected to {ans.location} and {again.location}")
            else:
                self.rec.count("skipped_double_posts")
        m = _ID_IN_PATH.search(ans.location.split("?")[0]) if ans.status == 302 else None
        if m:
            self.jobs.append(int(m.group(1)))
            self.rec.created(name)

    def cancel(self) -> None:
        job_id = self.jobs.pop(self.rng.randrange(len(self.jobs)))
        if self.rng.random() < 0.5:
            self.req("api_cancel", self.api, "POST", f"/api/jobs/{job_id}/cancel/", {})
        else:
            ans = self.req("web_cancel", self.web, "POST", f"/jobs/{job_id}/cancel/", [])
            self.rec.outcome("web_cancel", ans, self.web)

    # provider writes
    def _pick(self, believed: str) -> int | None:
        wanted = [n for n, s in self.nodes.items() if s == believed]
        if wanted and self.rng.random() < 0.85:
            return self.rng.choice(wanted)
        return self.rng.choice(list(self.nodes)) if self.nodes else None

    def reclaim(self) -> None:
        node = self._pick("up")
        if node is None:
            return self.register()
        kind = self.rng.choice(["api_scheduled", "api_emergency", "web_emergency"])
        if kind == "api_scheduled":
            ans = self.create("api_reclaim_scheduled", f"/api/nodes/{node}/reclaim/",
                              {"notice_s": float(self.rng.randint(2, 15))})
            ok = ans.status == 201
        elif kind == "api_emergency":
            ans = self.create("api_reclaim_emergency", f"/api/nodes/{node}/emergency-reclaim/", {})
            ok = ans.status == 201
        else:
            ans = self.req("web_reclaim_emergency", self.web, "POST",
                           f"/provider/nodes/{node}/reclaim/emergency/", [("confirm", "on")])
            ok = ans.status == 302 and ans.location.endswith("#reclaims")
            self.rec.outcome("web_reclaim_emergency", ans, self.web)
        if ok or ans.status in (302, 409):
            self.nodes[node] = "reclaimed"

    def lend_again(self) -> None:
        node = self._pick("reclaimed")
        if node is None:
            return self.register()
        if self.rng.random() < 0.5:
            ans = self.req("api_lend_again", self.api, "POST", f"/api/nodes/{node}/lend-again/", {})
            if ans.status in (200, 409):
                self.nodes[node] = "up"
        else:
            ans = self.req("web_lend_again", self.web, "POST", f"/provider/nodes/{node}/lend-again/", [])
            if ans.status == 302:
                self.nodes[node] = "up"
            self.rec.outcome("web_lend_again", ans, self.web)

    def register(self) -> None:
        name = self.name()
        gpus = self.rng.choice([1, 1, 2])
        payload = {"name": name, "building": self.rng.choice(self.buildings) if self.buildings else 1,
                   "gpus": [{"model": self.rng.choice(GPU_MODELS)}] * gpus, "gpu_floor": 0,
                   "access_link_bytes_per_s": 125e6}
        ans = self.create("api_register", "/api/nodes/", payload)
        body = ans.json()
        if ans.status == 201 and isinstance(body, dict):
            self.nodes[int(body["id"])] = "up"
            self.rec.created(name)

    def settings(self) -> None:
        node = self.rng.choice(list(self.nodes))
        if self.rng.random() < 0.5:
            change = self.rng.choice([{"gpu_floor": 0},
                                      {"access_link_bytes_per_s": float(self.rng.randint(100, 125)) * 1e6}])
            self.req("api_settings", self.api, "PATCH", f"/api/nodes/{node}/", change)
            return
        if self.settings_fields is None:
            page = self.req("web_node_page", self.web, "GET", f"/provider/nodes/{node}/")
            forms = [f for f in parse_forms(page.body) if f.action.rstrip("/").endswith("/settings")]
            if page.status != 200 or not forms:
                return
            # One blank lending-window row and the management form: saving replaces the windows with none.
            self.settings_fields = [(k, v) for k, v in forms[0].fields
                                    if not re.match(r"w-\d+-", k) and k != "w-INITIAL_FORMS"]
            self.settings_fields.append(("w-INITIAL_FORMS", "0"))
        fields = [(k, v) for k, v in self.settings_fields if k not in ("gpu_floor", "w-TOTAL_FORMS")]
        fields += [("gpu_floor", "0"), ("w-TOTAL_FORMS", "1"), ("w-0-weekday", ""), ("w-0-start_time", ""),
                   ("w-0-end_time", "")]
        ans = self.req("web_settings", self.web, "POST", f"/provider/nodes/{node}/settings/", fields)
        self.rec.outcome("web_settings", ans, self.web)


def run_writes(base_url: str, total: int, clients: int, credentials: dict[str, Any], seed: int = 0,
               run: str | None = None) -> WriteResult:
    """``total`` mixed writes from ``clients`` concurrent threads (see the module docstring)."""
    researchers, providers = _user_list(credentials, "researchers"), _user_list(credentials, "providers")
    if not researchers or not providers:
        raise ValueError("credentials need at least one researcher and one provider")
    run = run or uuid.uuid4().hex[:8]  # the seed fixes the mix, never the names (a rerun must not collide)
    result = WriteResult(run=run)
    rec = _Recorder(result)
    workers: list[_Client] = []
    counts = {"researcher": 0, "provider": 0}
    for i in range(clients):
        role = "researcher" if i % 3 == 0 else "provider"
        pool = researchers if role == "researcher" else providers
        workers.append(_Client(i, role, pool[counts[role] % len(pool)], base_url, run, rec,
                               random.Random(seed * 1000 + i)))
        counts[role] += 1
    shares = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    start_gate = threading.Barrier(clients)

    def work(client: _Client, n: int) -> None:
        try:
            try:
                client.setup()
            finally:
                start_gate.wait()
            for _ in range(n):
                client.step()
        except Exception as exc:
            rec.failed(f"client {client.index} ({client.role} {client.user[0]}): {type(exc).__name__}: {exc}")
        finally:
            client.api.close()
            client.web.close()

    result.elapsed_s = _run_threads([lambda c=c, n=n: work(c, n) for c, n in zip(workers, shares, strict=True)])
    return result


# --- reads -------------------------------------------------------------------------------------------------------

# What each role reads, in the proportions a client picks them (uniformly). ``{job}`` and ``{node}`` are filled
# with an id the client may see (picked afresh for every request). "api" paths go with the client's token,
# "web" paths with its browser session.
READ_MIX: dict[str, list[tuple[str, str]]] = {
    "admin": [("web", "/dashboard/"), ("web", "/dashboard/charts.json"), ("web", "/dashboard/?fragment=summary"),
              ("api", "/api/summary/"), ("api", "/api/nodes/"), ("api", "/api/nodes/{node}/"), ("api", "/api/jobs/"),
              ("api", "/api/jobs/{job}/"), ("api", "/api/reclaims/"), ("api", "/api/campus/topology/")],
    "researcher": [("web", "/jobs/"), ("web", "/jobs/{job}/"), ("api", "/api/jobs/"), ("api", "/api/jobs/{job}/"),
                   ("api", "/api/nodes/"), ("api", "/api/summary/"), ("api", "/api/me/")],
    "provider": [("web", "/provider/"), ("web", "/provider/nodes/{node}/"), ("api", "/api/nodes/?mine=1"),
                 ("api", "/api/nodes/{node}/"), ("api", "/api/reclaims/"), ("api", "/api/summary/")],
}
ROLES = ("admin", "researcher", "provider")


@dataclass
class ReadResult:
    requests: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    by_path: dict[str, list[float]] = field(default_factory=dict)  # path template -> latencies (ms)
    statuses: Counter[int] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    what: str = "reads"
    sent_at: list[float] = field(default_factory=list)  # time.monotonic() each request was sent, as latencies_ms

    def percentile(self, q: float) -> float:
        return _percentile(self.latencies_ms, q)

    @property
    def p50_ms(self) -> float:
        return self.percentile(50)

    @property
    def p99_ms(self) -> float:
        return self.percentile(99)

    def record(self, key: str, ans: Answer, ok_status: int = 200) -> None:
        """One answer (the caller holds the lock)."""
        self.requests += 1
        self.latencies_ms.append(ans.ms)
        self.sent_at.append(time.monotonic() - ans.ms / 1000.0)
        self.by_path.setdefault(key, []).append(ans.ms)
        self.statuses[ans.status] += 1
        if ans.status != ok_status:
            self.errors += 1
            if len(self.samples) < SAMPLES:
                self.samples.append(f"{key} {ans.status} {ans.error or ans.body[:200]!r}")

    def summary(self) -> str:
        return (f"load: {self.requests} requests, {self.errors} errors, p50 {self.p50_ms:.0f} ms, "
                f"p99 {self.p99_ms:.0f} ms")

    def report(self) -> str:
        rate = self.requests / self.elapsed_s if self.elapsed_s else 0.0
        lines = [f"{self.what}: {self.requests} requests in {self.elapsed_s:.1f} s ({rate:.1f}/s), {self.errors} "
                 f"errors, p50 {self.p50_ms:.0f} ms, p90 {self.percentile(90):.0f} ms, p99 {self.p99_ms:.0f} ms, "
                 f"max {max(self.latencies_ms, default=0):.0f} ms",
                 "  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))]
        for key, values in sorted(self.by_path.items()):
            lines.append(f"  {key}: {len(values)} requests, p50 {_percentile(values, 50):.0f} ms, "
                         f"p99 {_percentile(values, 99):.0f} ms")
        lines += [f"  error: {s}" for s in self.samples]
        return "\n".join(lines)

    def by_window(self, since: float, window_s: float = 10.0) -> str:
        """p50/p99 of the requests sent in each ``window_s`` from ``since`` (time.monotonic()): where in the run
        the slow ones were (a burst shows as the windows it lands in)."""
        windows: dict[int, list[float]] = {}
        for at, ms in zip(self.sent_at, self.latencies_ms, strict=True):
            windows.setdefault(max(0, int((at - since) // window_s)), []).append(ms)
        return f"  {self.what} by {window_s:g} s window (p50/p99 ms): " + ", ".join(
            f"{int(i * window_s)}-{int((i + 1) * window_s)} s {_percentile(v, 50):.0f}/{_percentile(v, 99):.0f}"
            for i, v in sorted(windows.items()))


class _Session:
    """One user's logins (API token, browser session) and the ids they may read; shared by the clients that
    are this user (a person's several tabs, a script's several threads), so setup costs one login per user."""

    def __init__(self, base_url: str, role: str, user: tuple[str, str]) -> None:
        self.role, self.user = role, user
        api, web = Http(base_url), Http(base_url)
        try:
            api_login(api, *user)
            web_login(web, *user)
            self.api_headers = dict(api.headers)
            self.web_cookies = dict(web.cookies)
            jobs = (api.get("/api/jobs/?limit=100").json() or {}).get("results", [])
            nodes_path = "/api/nodes/?mine=1&limit=100" if role == "provider" else "/api/nodes/?limit=100"
            nodes = (api.get(nodes_path).json() or {}).get("results", [])
        finally:
            api.close()
            web.close()
        self.job_ids = [int(j["id"]) for j in jobs]
        self.node_ids = [int(n["id"]) for n in nodes]

    def paths(self) -> list[tuple[str, str]]:
        """This role's mix, without the detail pages it has no id for."""
        return [(kind, path) for kind, path in READ_MIX[self.role]
                if ("{job}" not in path or self.job_ids) and ("{node}" not in path or self.node_ids)]


def read_sessions(base_url: str, credentials: dict[str, Any]) -> dict[str, list[_Session]]:
    """Every user's logins for :func:`run_reads` (made once, before the clock starts)."""
    users = {"admin": _user_list(credentials, "admin"), "researcher": _user_list(credentials, "researchers"),
             "provider": _user_list(credentials, "providers")}
    missing = [role for role, listed in users.items() if not listed]
    if missing:
        raise ValueError(f"credentials need at least one of: {', '.join(missing)}")
    return {role: [_Session(base_url, role, user) for user in listed] for role, listed in users.items()}


def _bases(base_url: str | list[str]) -> list[str]:
    """One portal address, or several server processes of one portal (clients spread over them in turn, as a
    reverse proxy's round robin would)."""
    return [base_url] if isinstance(base_url, str) else list(base_url)


def warm_up(base_url: str | list[str], sessions: dict[str, list[_Session]], rounds: int = 2) -> ReadResult:
    """Each read of the mix, as each role, ``rounds`` times on every server process, one at a time, before the
    clock starts: what a deployment's smoke check does once a process is up (a process serving for days has its
    templates compiled, its pools filled, its lazy imports done; a measurement of 60 s should not be one of a cold
    start). Returned so the caller can report it; not counted in the reads."""
    result = ReadResult(what="warm-up")
    for base in _bases(base_url):
        for role, users in sessions.items():
            session = users[0]
            api, web = Http(base), Http(base)
            api.headers.update(session.api_headers)
            web.cookies.update(session.web_cookies)
            try:
                for _ in range(rounds):
                    for kind, template in session.paths():
                        path = template.format(job=(session.job_ids or [0])[0], node=(session.node_ids or [0])[0])
                        result.record(f"{role} GET {template}", (api if kind == "api" else web).get(path))
            finally:
                api.close()
                web.close()
    return result


def run_reads(base_url: str | list[str], clients: int, duration_s: float, credentials: dict[str, Any],
              think_s: float = 0.0, seed: int = 0, sessions: dict[str, list[_Session]] | None = None) -> ReadResult:
    """``clients`` closed-loop clients reading for ``duration_s``: client ``i`` is an admin, a researcher or a
    provider (``ROLES[i % 3]``) and repeats: pick a read of its role (``READ_MIX``), send it, wait for the answer,
    then think for a time drawn uniformly from [0.5, 1.5] × ``think_s`` (0: the next request at once). Any answer
    but 200 is an error. Logins happen before the clock starts (one per user, shared by its clients; or pass
    ``sessions`` from :func:`read_sessions`)."""
    bases = _bases(base_url)
    sessions = sessions or read_sessions(bases[0], credentials)
    result = ReadResult()
    lock = threading.Lock()
    start_gate = threading.Barrier(clients)
    deadline = [0.0]

    def work(i: int) -> None:
        rng = random.Random(seed * 100_003 + i)
        role = ROLES[i % len(ROLES)]
        session = sessions[role][(i // len(ROLES)) % len(sessions[role])]
        api, web = Http(bases[i % len(bases)]), Http(bases[i % len(bases)])
        api.headers.update(session.api_headers)
        web.cookies.update(session.web_cookies)
        paths = session.paths()
        try:
            if start_gate.wait() == 0:
                deadline[0] = time.monotonic() + duration_s
            start_gate.wait()
            if think_s > 0:  # spread the first requests over one think time, as clients that started apart
                time.sleep(rng.uniform(0.0, think_s))
            while time.monotonic() < deadline[0]:
                kind, template = rng.choice(paths)
                path = template.format(job=rng.choice(session.job_ids or [0]),
                                       node=rng.choice(session.node_ids or [0]))
                ans = (api if kind == "api" else web).get(path)
                with lock:
                    result.record(f"{role} GET {template}", ans)
                if think_s > 0:
                    time.sleep(rng.uniform(0.5, 1.5) * think_s)
        finally:
            api.close()
            web.close()

    result.elapsed_s = _run_threads([lambda i=i: work(i) for i in range(clients)])
    return result


def submit_tokens(base_url: str, credentials: dict[str, Any]) -> list[dict[str, str]]:
    """The researchers' ``Authorization`` headers for :func:`run_submit_burst` (log in before the clock starts)."""
    researchers = _user_list(credentials, "researchers")
    if not researchers:
        raise ValueError("credentials need a researcher")
    tokens = []
    for user in researchers:
        http = Http(base_url)
        try:
            api_login(http, *user)
            tokens.append(dict(http.headers))
        finally:
            http.close()
    return tokens


def run_submit_burst(base_url: str | list[str], count: int, tokens: list[dict[str, str]],
                     run: str | None = None) -> ReadResult:
    """``count`` job submits (``POST /api/jobs/``, each with its own ``Idempotency-Key``) sent at the same instant
    from ``count`` threads, with the researchers' ``tokens`` (:func:`submit_tokens`) in turn. Any answer but 201
    is an error."""
    bases = _bases(base_url)
    run = run or uuid.uuid4().hex[:8]
    result = ReadResult(what="submits")
    lock = threading.Lock()
    gate = threading.Barrier(count)

    def work(i: int) -> None:
        http = Http(bases[i % len(bases)])
        http.headers.update(tokens[i % len(tokens)])
        payload = {"name": f"load-{run}-burst-{i}", "gpu_count": 1, "expected_runtime_s": 60.0,
                   "ckpt_bytes_estimate": 4096, "command": JOB_COMMAND, "loss_budget_s": 10.0, "restart_s": 1.0}
        try:
            gate.wait()
            ans = http.post_json("/api/jobs/", payload, {"Idempotency-Key": str(uuid.uuid4())})
            with lock:
                result.record("POST /api/jobs/", ans, ok_status=201)
        finally:
            http.close()

    result.elapsed_s = _run_threads([lambda i=i: work(i) for i in range(count)])
    return result


def _run_threads(targets: list[Any]) -> float:
    """Run each target in its own thread; the wall time until the last one ends (s)."""
    started = time.monotonic()
    threads = [threading.Thread(target=target, name=f"load-{i}", daemon=True) for i, target in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started


# --- command line ------------------------------------------------------------------------------------------------


def load_credentials(text: str) -> dict[str, Any]:
    path = Path(text)
    with contextlib.suppress(OSError, ValueError):
        if not text.lstrip().startswith("{") and path.is_file():
            text = path.read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("credentials: a JSON object {admin, researchers, providers}")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writes", help="concurrent mixed writes")
    w.add_argument("--base", required=True)
    w.add_argument("--total", type=int, default=1000)
    w.add_argument("--clients", type=int, default=6)
    w.add_argument("--credentials", required=True, help="JSON or a file holding it")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--run", default=None, help="name tag of this run (default: random)")
    r = sub.add_parser("reads", help="read latencies of the API lists and the dashboard")
    r.add_argument("--base", required=True)
    r.add_argument("--clients", type=int, default=4)
    r.add_argument("--duration", type=float, default=20.0)
    r.add_argument("--credentials", required=True, help="JSON or a file holding it")
    r.add_argument("--think", type=float, default=0.0, help="mean think time between a client's requests (s)")
    r.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    credentials = load_credentials(args.credentials)
    if args.command == "writes":
        wres = run_writes(args.base, args.total, args.clients, credentials, seed=args.seed, run=args.run)
        print(wres.report())
        print(wres.summary())
        return 1 if wres.server_errors or wres.replay_mismatches or wres.client_failures else 0
    rres = run_reads(args.base, args.clients, args.duration, credentials, think_s=args.think, seed=args.seed)
    print(rres.report())
    print(rres.summary())
    return 1 if rres.errors else 0


if __name__ == "__main__":
    sys.exit(main())
