"""Browser tests: Playwright (sync) driving Debian's chromium against a real daphne and PostgreSQL.

Run them in their own pytest process (STACK.md gotcha 4: pytest-playwright and pytest-asyncio clash):
``make test-browser``, over pytest-xdist workers (``--dist loadgroup``: a file's tests stay together on one
worker, in order, as they may build on each other's rows, but for :data:`INDEPENDENT_TESTS`). What each worker's session sets up:

1. a fresh database ``reclaimnet_browser_<pid>`` next to ``DATABASE_URL``'s (dropped at the end): a copy
   (``CREATE DATABASE … TEMPLATE``) of one the run's first process migrated, seeded with ``seed_campus
   --demo-users`` and ``seed_history`` and collected the static files for, once for all its workers;
2. this process's Django connection is pointed at it (tests read and write rows there, e.g. to play the
   control plane), with ``DJANGO_ALLOW_ASYNC_UNSAFE`` because Playwright's sync API runs an event loop;
3. ``collectstatic`` and a daphne subprocess on a free port, serving pages, static files (whitenoise) and
   websockets through the Redis channel layer, so ``publish()`` from this process reaches the browser.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from playwright.sync_api import expect

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
# A page that answers in 6 s on a machine loaded by parallel builds is slow, not wrong: assertions that wait for
# the page to change wait up to 15 s (Playwright's default of 5 s made results depend on the machine's load).
expect.set_options(timeout=15_000)

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
# One database per run: two checkouts sharing a PostgreSQL server (engineers running `make test` side by side)
# must not drop or re-seed each other's database in the middle of a run.
BROWSER_DB = f"reclaimnet_browser_{os.getpid()}"
PASSWORD = "reclaimnet-demo"


# The seeded database every worker's is copied from: made once per run by the process that runs first (xdist's
# controller, or the only process), dropped by it at the end.
TEMPLATE_DB_ENV = "RECLAIMNET_BROWSER_TEMPLATE_DB"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get(TEMPLATE_DB_ENV) or not _wants_browser(config):
        return
    try:
        admin_url, _ = _database_urls()
    except pytest.skip.Exception:
        return  # each test skips with the reason
    template = f"reclaimnet_browser_tpl_{os.getpid()}"
    _psql(admin_url, f"DROP DATABASE IF EXISTS {template} WITH (FORCE)")
    _psql(admin_url, f"CREATE DATABASE {template}")
    env = _server_env(urlunsplit(urlsplit(admin_url)._replace(path=f"/{template}")))
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "seed_campus", "--demo-users")
    _manage(env, "seed_history")
    _manage(env, "collectstatic", "--noinput", "-v", "0")
    os.environ[TEMPLATE_DB_ENV] = template  # the workers, started after this, copy it
    config.add_cleanup(lambda: _psql(admin_url, f"DROP DATABASE IF EXISTS {template} WITH (FORCE)"))


def _wants_browser(config: pytest.Config) -> bool:
    """Whether this run collects the browser tests (``make test``'s main run ignores them)."""
    args = [str(a) for a in config.args]
    return any("tests/browser" in a or a.rstrip("/").endswith("browser") for a in args)


# Files whose tests only read the seeded campus: each test may run on any worker (the rest keep a file's tests
# together on one, in order, for they build on each other's rows).
INDEPENDENT_TESTS = ("test_tour.py",)


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser" in str(item.path):
            item.add_marker(pytest.mark.browser)
            alone = item.path.name in INDEPENDENT_TESTS
            item.add_marker(pytest.mark.xdist_group(item.nodeid if alone else item.path.name))


def _database_urls() -> tuple[str, str]:
    """(admin URL to create/drop databases, URL of the browser-test database), from ``DATABASE_URL``."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.skip("browser tests need DATABASE_URL=postgres://… (daphne and the tests share the database)")
    if not os.environ.get("REDIS_URL"):
        pytest.skip("browser tests need REDIS_URL (live events cross from the test process to daphne)")
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), urlunsplit(parts._replace(path=f"/{BROWSER_DB}"))


def _psql(admin_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql)


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_env(database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    # DEBUG off, as `make demo` and production run: the portal's own error pages, static files via whitenoise.
    env.update({"DATABASE_URL": database_url, "RECLAIMNET_TESTING": "1", "PYTHONUNBUFFERED": "1", "DEBUG": "0"})
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


@pytest.fixture(scope="session")
def server_env() -> dict[str, str]:
    _, browser_url = _database_urls()
    return _server_env(browser_url)


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker: Any, server_env: dict[str, str]) -> Iterator[None]:
    """Replace pytest-django's test database with one daphne can share (no transaction wrapping)."""
    from django.conf import settings
    from django.db import connections

    admin_url, _ = _database_urls()
    _psql(admin_url, f"DROP DATABASE IF EXISTS {BROWSER_DB} WITH (FORCE)")
    template = os.environ.get(TEMPLATE_DB_ENV)
    if template:
        _psql(admin_url, f"CREATE DATABASE {BROWSER_DB} TEMPLATE {template}")
    else:  # a run that did not make the template (pytest_configure): seed this one
        _psql(admin_url, f"CREATE DATABASE {BROWSER_DB}")
        _manage(server_env, "migrate", "--noinput", "-v", "0")
        _manage(server_env, "seed_campus", "--demo-users")
        _manage(server_env, "seed_history")
        _manage(server_env, "collectstatic", "--noinput", "-v", "0")
    connections["default"].close()
    settings.DATABASES["default"]["NAME"] = BROWSER_DB
    connections["default"].settings_dict["NAME"] = BROWSER_DB
    with django_db_blocker.unblock():
        yield
        connections.close_all()
    _purge_queued_tasks()
    _psql(admin_url, f"DROP DATABASE IF EXISTS {BROWSER_DB} WITH (FORCE)")


def _purge_queued_tasks() -> None:
    """No Celery worker runs here: drop the control-plane tasks the pages queued (at the end of the session)."""
    try:
        from portal.celery import app

        app.control.purge()
    except Exception:  # the broker being gone must not fail the suite
        pass


@pytest.fixture(scope="session")
def db_access(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session")
def live_url(django_db_setup: None, server_env: dict[str, str]) -> Iterator[str]:
    """A daphne subprocess serving the portal against the browser-test database."""
    port = _free_port()
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # one daphne (and database) per xdist worker
    log = (ROOT / "test-artifacts").joinpath(f"daphne-browser-{worker}.log" if worker else "daphne-browser.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port),
             "portal.asgi:application"],
            cwd=ROOT, env=server_env, stdout=out, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 40
        while True:
            try:
                with urllib.request.urlopen(url + "/accounts/login/", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"daphne did not start; see {log}")
            time.sleep(0.3)
        try:
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def base_url(live_url: str) -> str:
    return live_url


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Debian's chromium, headless, nothing downloaded (no ``playwright install``)."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "headless": True, "args": CHROMIUM_ARGS}


@pytest.fixture(autouse=True)
def _db(db_access: None) -> None:
    """Every browser test may use the ORM (to check what the pages wrote, or to play the control plane)."""


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """``screenshot(page, "what")`` saves test-artifacts/screenshots/<test>--<what>.png (full page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    test = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)

    def take(page: Any, what: str) -> Path:
        path = SCREENSHOTS / f"{test}--{what}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def publish_live(groups: list[str], event: str, **fields: Any) -> None:
    """``portal.control.link.publish.publish`` from a worker thread: Playwright's sync API keeps an event loop
    running in the test thread, where ``async_to_sync`` refuses to run."""
    from concurrent.futures import ThreadPoolExecutor

    from portal.control.link.publish import publish

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(publish, groups, event, **fields).result(timeout=10)


@pytest.fixture
def login(base_url: str) -> Callable[[Any, str], None]:
    def sign_in(page: Any, username: str) -> None:
        page.goto(base_url + "/accounts/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        with page.expect_navigation():
            page.get_by_role("button", name="Sign in").click()
        if "/accounts/login/" in page.url:
            errors = page.locator(".form-errors").all_inner_texts()
            pytest.fail(f"login as {username} failed: {errors}")

    return sign_in
