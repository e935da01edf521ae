"""Fixtures for the command line against a live portal: a real HTTP server of the portal (Django's
``LiveServerThread``, what pytest-django's ``live_server`` runs) on the test database, one campus, and a
terminal per user with its own config directory, that runs ``reclaimnet`` in this process or, where a real
process matters, as the installed console script in a subprocess.

The server and the campus live for the module, as tests/e2e's stack does: the server's threads must see the rows,
so nothing is wrapped in a per-test transaction, and one flush at the end (not one per test, seconds each on
PostgreSQL) leaves the database empty for the suites after it. Tests therefore make their own jobs and nodes and
count only those.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.portal import factories as f

EXE = Path(sys.executable).parent / "reclaimnet"


@dataclass
class Terminal:
    """One user's shell: ``RECLAIMNET_URL`` set to the live server, its own ``XDG_CONFIG_HOME``.

    ``run`` calls ``reclaimnet.cli.main(argv)`` in this process with its environment, standard input and output
    swapped for the call (milliseconds, where a subprocess spends most of a second starting Python);
    ``run_script`` runs the installed console script in a subprocess, for what only a real process shows (the
    entry point, the exit status as the shell sees it, the file modes it creates). Both answer a
    ``CompletedProcess``."""

    url: str
    config_home: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECLAIMNET_")}
        return {**env, **self._own_env(), **extra}

    def _own_env(self) -> dict[str, str]:
        return {"RECLAIMNET_URL": self.url, "XDG_CONFIG_HOME": str(self.config_home),
                "HOME": str(self.config_home.parent)}

    def run(self, *args: str, input: str | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """The command in this process. Only the variables the command line reads are swapped (the live server's
        thread shares ``os.environ``), and ``RECLAIMNET_TOKEN`` is unset as a fresh shell's would be."""
        from reclaimnet.cli import main

        stdout, stderr = io.StringIO(), io.StringIO()
        swapped = {**self._own_env(), "RECLAIMNET_TOKEN": None}
        saved = {name: os.environ.get(name) for name in swapped}
        with _CLI_LOCK, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            saved_stdin = sys.stdin
            sys.stdin = io.StringIO(input or "")
            _set_env(swapped)
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse: usage errors, --help, --version
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
            finally:
                _set_env(saved)
                sys.stdin = saved_stdin
        return subprocess.CompletedProcess(["reclaimnet", *args], code, stdout.getvalue(), stderr.getvalue())

    def run_script(self, *args: str, input: str | None = None, timeout_s: float = 30) \
            -> subprocess.CompletedProcess[str]:
        """The installed console script in a subprocess."""
        return subprocess.run([str(EXE), *args], input=input, env=self.env(), capture_output=True, text=True,
                              timeout=timeout_s)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(EXE), *args], env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1)

    def login(self, username: str, password: str = f.PASSWORD) -> subprocess.CompletedProcess[str]:
        return self.run("login", "--username", username, "--password-stdin", input=password + "\n")


_CLI_LOCK = threading.Lock()  # one in-process command at a time: they swap process-wide state


def _set_env(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@dataclass
class LiveCampus:
    """The permission tests' campus (``tests.portal.factories.make_two_labs``) behind a live portal at ``url``:
    Vision Lab (member "provider") with vision-01, Robotics Lab with robotics-01, NLP Group (member
    "researcher"), Bio Group (member "other_researcher"); every password is ``factories.PASSWORD``."""

    url: str
    labs: f.TwoLabs
    home: Path

    def terminal(self, username: str | None) -> Terminal:
        """A shell logged in as ``username`` (logged in once per module), or a fresh one that is not."""
        if username is None:
            return Terminal(self.url, self.home / f"nobody-{f.uid()}" / "config")
        shell = Terminal(self.url, self.home / username / "config")
        if not (shell.config_home / "reclaimnet" / "config.json").exists():
            done = shell.login(username)
            assert done.returncode == 0, done.stderr
        return shell


@pytest.fixture(scope="module")
def live_campus(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) \
        -> Iterator[LiveCampus]:
    from django.conf import settings
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.management import call_command
    from django.test import override_settings
    from django.test.testcases import LiveServerThread

    assert settings.DATABASES["default"]["NAME"].startswith("test_"), "never the configured database"
    media = tmp_path_factory.mktemp("cli-media")
    results = override_settings(  # results (design §14) kept under this module's temporary directory
        STORAGES={**settings.STORAGES, "results": {"BACKEND": "portal.core.results_storage.AtomicFileSystemStorage",
                                                   "OPTIONS": {"location": str(media / "results")}}},
        RECLAIMNET_RESULTS_STAGING_DIR=media / "results-staging")
    with django_db_blocker.unblock(), results:
        labs = f.make_two_labs()
        for user in labs.users.values():
            user.set_password(f.PASSWORD)
            user.save(update_fields=["password"])
        server = LiveServerThread("localhost", StaticFilesHandler)
        server.daemon = True
        server.start()
        server.is_ready.wait()
        if server.error:
            raise server.error
        try:
            yield LiveCampus(f"http://localhost:{server.port}", labs, tmp_path_factory.mktemp("cli-homes"))
        finally:
            server.terminate()
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture
def db(live_campus: LiveCampus) -> None:
    """pytest-django's ``db``, replaced in this directory: the database access the live campus opened for the
    module, with no per-test transaction (the server's threads must see what a test writes). A test that uses
    it makes pytest-django create the test database."""


@pytest.fixture
def campus(db: None, live_campus: LiveCampus) -> LiveCampus:
    return live_campus
