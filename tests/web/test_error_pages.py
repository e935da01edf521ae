"""The portal's own error pages (400, 403, 404, 500, a refused form), rendered as Django renders them with DEBUG
off, and `make demo` running as production does: DEBUG off, its own key (README "make demo")."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from django.views import defaults
from django.views.csrf import csrf_failure

REPO = Path(__file__).resolve().parents[2]


def _page(response: object) -> str:
    content = getattr(response, "content", b"").decode()
    assert "/static/reclaimnet/app.css" in content, "in the site's look"
    assert 'href="/"' in content, "a way back"
    assert "Traceback" not in content and "Using the URLconf" not in content
    return content


def test_the_server_error_page_says_what_happened_and_what_to_do() -> None:
    """Rendered with no request and no database (what Django does after an unhandled error)."""
    response = defaults.server_error(RequestFactory().get("/jobs/"))
    assert response.status_code == 500
    page = _page(response)
    assert "Something went wrong on the portal" in page and "tell a campus admin" in page


@pytest.mark.django_db
def test_a_request_for_another_host_name_gets_our_bad_request_page() -> None:
    response = Client(HTTP_HOST="evil.example").get("/")
    assert response.status_code == 400
    assert "could not read this request" in _page(response)


@pytest.mark.django_db
def test_the_not_allowed_page_says_who_may_and_whom_to_ask() -> None:
    request = RequestFactory().get("/provider/")
    request.user = AnonymousUser()
    response = defaults.permission_denied(request, PermissionDenied())
    assert response.status_code == 403
    page = _page(response)
    assert "Not allowed" in page and "ask a campus admin" in page


def test_a_refused_form_says_nothing_changed_and_to_send_it_again() -> None:
    response = csrf_failure(RequestFactory().post("/accounts/logout/"), reason="CSRF token missing.")
    assert response.status_code == 403
    page = _page(response)
    assert "Nothing was changed" in page and "CSRF" not in page


def test_the_demo_runs_with_debug_off_plain_http_and_its_own_key(tmp_path: Path) -> None:
    """scripts/demo.sh's environment at its first manage.py (the stub python records it and stops the script),
    and the settings that environment gives: DEBUG off, no HTTPS redirect on loopback, the key from .demo/."""
    seen = tmp_path / "env.json"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exec {sys.executable} "$@"\n'
                    f'{sys.executable} -c "import json, os; print(json.dumps(dict(os.environ)))" > {seen}\nexit 3\n')
    stub.chmod(0o755)
    demo_dir = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEBUG", "RECLAIMNET_", "SECRET_KEY"))}
    env.update(DEMO_PYTHON=str(stub), DEMO_DIR=str(demo_dir))
    done = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert done.returncode == 3, done.stderr
    demo_env = json.loads(seen.read_text())
    assert demo_env["DEBUG"] == "0" and demo_env["RECLAIMNET_INSECURE_HTTP"] == "1"
    key = Path(demo_env["SECRET_KEY_FILE"])
    assert key.parent == demo_dir and stat.S_IMODE(key.stat().st_mode) == 0o600

    code = "import json; from django.conf import settings as s; print(json.dumps([s.DEBUG, s.SECURE_SSL_REDIRECT, s.SECRET_KEY]))"
    demo_env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    shown = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO, env=demo_env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    debug, ssl_redirect, secret_key = json.loads(shown.stdout.strip().splitlines()[-1])
    assert debug is False and ssl_redirect is False
    assert secret_key == key.read_text().strip()
