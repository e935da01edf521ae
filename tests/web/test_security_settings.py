"""Security by default (docs/design.md §11): `check --deploy` clean for the production settings, every
``SECURE_*``/HSTS/CSP/cookie setting driven by the environment, the headers on pages and API answers, no inline
script the Content-Security-Policy would refuse, and secret files readable by their owner only."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.portal import factories as f

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_DIRS = [REPO / "portal" / "templates", *sorted((REPO / "portal").glob("*/templates"))]


def production_env(**overrides: str) -> dict[str, str]:
    """This environment as production has it: DEBUG off, a real secret key, a real host name, not the
    test suite (RECLAIMNET_TESTING unset), nothing from the security settings inherited."""
    drop = ("DEBUG", "SECRET_KEY", "RECLAIMNET_", "SECURE_", "SESSION_COOKIE", "CSRF_COOKIE", "ALLOWED_HOSTS",
            "PYTEST", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "reclaimnet.campus.example.edu",
                "CSRF_TRUSTED_ORIGINS": "https://reclaimnet.campus.example.edu", "LOG_LEVEL": "WARNING"})
    env.update(overrides)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def settings_in(env: dict[str, str], *names: str) -> dict[str, Any]:
    code = ("import json; from django.conf import settings as s; "
            f"print(json.dumps({{n: getattr(s, n) for n in {list(names)!r}}}, default=str))")
    done = manage(env, "shell", "-c", code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_for_the_production_settings() -> None:
    done = manage(production_env(), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "security.W" not in done.stdout + done.stderr


def test_plain_http_is_an_explicit_choice_that_check_deploy_reports() -> None:
    """The same settings with RECLAIMNET_INSECURE_HTTP=1 (the embedded default's plain http on 127.0.0.1)
    fail `check --deploy` with exactly the warnings the secure defaults avoid."""
    done = manage(production_env(RECLAIMNET_INSECURE_HTTP="1"), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    found = set(re.findall(r"security\.W0\d\d", done.stdout + done.stderr))
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= found


def test_each_security_setting_is_read_from_the_environment() -> None:
    names = ("SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD",
             "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_PROXY_SSL_HEADER", "SECURE_REFERRER_POLICY",
             "CONTENT_SECURITY_POLICY", "CONTENT_SECURITY_POLICY_REPORT_ONLY", "SILENCED_SYSTEM_CHECKS",
             "RECLAIMNET_LOGIN_FAILURE_LIMIT", "RECLAIMNET_LOGIN_COOLOFF_S", "RECLAIMNET_TRUSTED_PROXY_COUNT",
             "CACHES")
    defaults = settings_in(production_env(REDIS_URL="redis://127.0.0.1:6379/0"), *names)
    assert defaults["SECURE_SSL_REDIRECT"] and defaults["SESSION_COOKIE_SECURE"] and defaults["CSRF_COOKIE_SECURE"]
    assert defaults["SECURE_HSTS_SECONDS"] == 31_536_000 and defaults["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert not defaults["SECURE_HSTS_PRELOAD"] and defaults["SILENCED_SYSTEM_CHECKS"] == ["security.W021"]
    assert defaults["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert defaults["SECURE_REFERRER_POLICY"] == "same-origin"
    assert defaults["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]["script-src"] == ["'self'"]
    assert defaults["CONTENT_SECURITY_POLICY_REPORT_ONLY"] is None
    assert defaults["RECLAIMNET_LOGIN_FAILURE_LIMIT"] == 10 and defaults["RECLAIMNET_LOGIN_COOLOFF_S"] == 900
    assert defaults["RECLAIMNET_TRUSTED_PROXY_COUNT"] == 1  # the proxy trusted for X-Forwarded-Proto
    assert defaults["CACHES"]["default"]["BACKEND"].endswith("RedisCache")  # counters shared by every process

    changed = settings_in(production_env(
        SECURE_SSL_REDIRECT="0", SECURE_HSTS_SECONDS="600", SECURE_HSTS_INCLUDE_SUBDOMAINS="0",
        SECURE_HSTS_PRELOAD="1", SESSION_COOKIE_SECURE="0", CSRF_COOKIE_SECURE="0", SECURE_PROXY_SSL_HEADER="",
        SECURE_REFERRER_POLICY="no-referrer", RECLAIMNET_CSP="report-only",
        RECLAIMNET_CSP_REPORT_URI="https://csp.example.edu/r", RECLAIMNET_LOGIN_FAILURE_LIMIT="5",
        RECLAIMNET_LOGIN_COOLOFF_S="60", RECLAIMNET_TRUSTED_PROXY_COUNT="2", REDIS_URL=""), *names)
    assert not changed["SECURE_SSL_REDIRECT"] and not changed["SESSION_COOKIE_SECURE"]
    assert not changed["CSRF_COOKIE_SECURE"] and changed["SECURE_PROXY_SSL_HEADER"] is None
    assert changed["SECURE_HSTS_SECONDS"] == 600 and not changed["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert changed["SECURE_HSTS_PRELOAD"] and changed["SILENCED_SYSTEM_CHECKS"] == []
    assert changed["SECURE_REFERRER_POLICY"] == "no-referrer"
    assert changed["CONTENT_SECURITY_POLICY"] is None
    assert changed["CONTENT_SECURITY_POLICY_REPORT_ONLY"]["DIRECTIVES"]["report-uri"] == ["https://csp.example.edu/r"]
    assert changed["RECLAIMNET_LOGIN_FAILURE_LIMIT"] == 5 and changed["RECLAIMNET_LOGIN_COOLOFF_S"] == 60
    assert changed["RECLAIMNET_TRUSTED_PROXY_COUNT"] == 2
    assert changed["CACHES"]["default"]["BACKEND"].endswith("LocMemCache")

    embedded = settings_in(production_env(DEBUG="1"), "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
                           "SESSION_COOKIE_SECURE")
    assert embedded == {"SECURE_SSL_REDIRECT": False, "SECURE_HSTS_SECONDS": 0, "SESSION_COOKIE_SECURE": False}


@pytest.fixture
def https_settings(settings: Any) -> None:
    """Production's answers: behind a TLS proxy that says so in X-Forwarded-Proto, HSTS on."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True


def csp_of(response: Any) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/", "/accounts/login/", "/api/me/", "/api/nodes/"])
def test_pages_and_api_answers_carry_the_security_headers(https_settings: None, url: str) -> None:
    response = Client(HTTP_X_FORWARDED_PROTO="https").get(url)
    assert response.status_code in (200, 401, 403)
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    csp = csp_of(response)
    assert csp["script-src"] == ["'self'"] and csp["default-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"] and csp["object-src"] == ["'none'"]


@pytest.mark.django_db
def test_plain_http_is_redirected_to_https(https_settings: None) -> None:
    response = Client().get("/api/me/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/api/me/"


@pytest.mark.django_db
def test_signed_in_pages_carry_the_strict_policy(https_settings: None) -> None:
    client = Client(HTTP_X_FORWARDED_PROTO="https")
    client.force_login(f.make_user("root", staff=True))
    page = client.get("/dashboard/")
    assert page.status_code == 200
    assert csp_of(page)["script-src"] == ["'self'"]


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/api/docs/", "/api/redoc/"])
def test_the_api_docs_pages_run_only_the_portals_code(https_settings: None, url: str) -> None:
    """Swagger UI and ReDoc come from the portal's static files; their inline init code runs by this response's
    nonce, never by 'unsafe-inline', and no other origin is allowed (the other pages get no nonce at all)."""
    client = Client(HTTP_X_FORWARDED_PROTO="https")
    docs = client.get(url)
    assert docs.status_code == 200
    policy = csp_of(docs)
    nonce = re.search(r"'nonce-([^']+)'", " ".join(policy["script-src"]))
    assert nonce is not None and f'nonce="{nonce.group(1)}"' in docs.content.decode()
    for directive in ("script-src", "style-src"):
        assert "'unsafe-inline'" not in policy[directive]
        assert all(source.startswith("'") for source in policy[directive]), policy[directive]
    assert b"cdn.jsdelivr.net" not in docs.content and b"fonts.googleapis.com" not in docs.content
    assert policy["frame-ancestors"] == ["'none'"]
    assert "nonce-" not in " ".join(csp_of(client.get("/"))["script-src"])


def _templates() -> list[Path]:
    return [p for d in TEMPLATE_DIRS for p in sorted(d.rglob("*.html"))]


@pytest.mark.parametrize("path", _templates(), ids=lambda p: str(p.relative_to(REPO)))
def test_templates_have_no_inline_script(path: Path) -> None:
    """The policy allows scripts from the portal's own files only: an inline <script> or on…= handler would
    silently not run."""
    text = path.read_text()
    for tag in re.findall(r"<script\b[^>]*>", text):
        nonced = path.parent.name == "drf_spectacular" and 'nonce="{{ request.csp_nonce }}"' in tag  # docs pages
        assert "src=" in tag or 'type="application/json"' in tag or nonced, f"{path}: inline {tag}"
    assert not re.search(r"\son[a-z]+\s*=", text), f"{path}: inline event handler"
    assert "javascript:" not in text, path


def test_demo_secret_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """scripts/demo.sh writes .demo/secret_key 0600 and tightens one an older run left 0644 (keeping it).
    The demo's python is replaced by one that makes the key and stops the script at its first manage.py."""
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exec {sys.executable} "$@"\nexit 3\n')
    stub.chmod(0o755)
    demo_dir = tmp_path / "demo"
    env = {**os.environ, "DEMO_PYTHON": str(stub), "DEMO_DIR": str(demo_dir)}
    done = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert done.returncode == 3, done.stderr
    key = demo_dir / "secret_key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_text().strip()) >= 50
    assert stat.S_IMODE(demo_dir.stat().st_mode) == 0o700

    key.chmod(0o644)
    demo_dir.chmod(0o755)
    before = key.read_text()
    assert subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True,
                          timeout=60).returncode == 3
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text() == before
    assert stat.S_IMODE(demo_dir.stat().st_mode) == 0o700
