"""Campus sign-in against a real OpenID Connect provider (docs/design.md §20).

Two real servers on loopback: the portal (Django's ``LiveServerThread`` on the test database, as tests/cli does)
and the identity provider, django-oauth-toolkit in a second Django process (tests/sso/idp/serve.py) with its own
SQLite file, an RSA key made here, one confidential RS256 client for the portal and test users whose claims
come from a JSON file the tests rewrite. A ``requests.Session`` plays the browser.

The servers live for the module; nothing is wrapped in a per-test transaction (the portal's threads must see
the rows), and one flush at the end leaves the database empty for the suites after it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[2]
IDP_PASSWORD = "campus-password-1"
CLIENT_ID = "reclaimnet-portal"
# Who the campus directory knows, and what it says about them (rewritten by tests through Provider.set_claims).
PEOPLE: dict[str, dict[str, Any]] = {
    "ada": {"email": "ada@campus.test", "groups": ["vision-lab"], "eduperson_affiliation": ["staff"]},
    "bob": {"email": "bob@campus.test", "groups": ["nlp"], "eduperson_affiliation": ["student"]},
    "carol": {"email": "carol@campus.test", "groups": [], "eduperson_affiliation": ["alum"]},
    "dave": {"email": "dave@campus.test", "groups": ["nlp"], "eduperson_affiliation": ["student"]},
    "erin": {"email": "erin@campus.test", "groups": ["vision-lab"], "eduperson_affiliation": ["faculty"]},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class IdentityProvider:
    issuer: str
    client_secret: str
    claims_file: Path
    process: subprocess.Popen[bytes]
    people: dict[str, dict[str, Any]] = field(default_factory=dict)

    def set_claims(self, username: str, **claims: Any) -> None:
        """Change what the directory says about ``username`` (read by the provider at its next token request)."""
        self.people[username] = {**self.people[username], **claims}
        tmp = self.claims_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.people))
        tmp.replace(self.claims_file)


@dataclass
class Portal:
    url: str


@pytest.fixture(scope="module")
def portal(django_db_setup: Any, django_db_blocker: Any) -> Iterator[Portal]:
    from django.conf import settings
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.management import call_command
    from django.test.testcases import LiveServerThread

    assert settings.DATABASES["default"]["NAME"].startswith("test_"), "never the configured database"
    with django_db_blocker.unblock():
        server = LiveServerThread("127.0.0.1", StaticFilesHandler)
        server.daemon = True
        server.start()
        server.is_ready.wait()
        if server.error:
            raise server.error
        try:
            yield Portal(f"http://127.0.0.1:{server.port}")
        finally:
            server.terminate()
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def idp(portal: Portal, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityProvider]:
    """The identity provider process, started and answering its discovery document."""
    home = tmp_path_factory.mktemp("idp")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = home / "rsa.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    claims_file = home / "claims.json"
    claims_file.write_text(json.dumps(PEOPLE))
    port = free_port()
    issuer = f"http://127.0.0.1:{port}/o"
    client_secret = secrets.token_urlsafe(32)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RECLAIMNET_", "DJANGO_"))},
           "IDP_DB": str(home / "idp.sqlite3"), "IDP_ISSUER": issuer, "IDP_RSA_KEY_FILE": str(key_file),
           "IDP_CLAIMS_FILE": str(claims_file), "IDP_PASSWORD": IDP_PASSWORD, "IDP_ADDR": f"127.0.0.1:{port}",
           "IDP_CLIENT": json.dumps({"client_id": CLIENT_ID, "client_secret": client_secret,
                                     "redirect_uri": f"{portal.url}/oidc/callback/",
                                     "post_logout_redirect_uri": f"{portal.url}/accounts/login/"})}
    log = (home / "idp.log").open("wb")
    process = subprocess.Popen([sys.executable, str(ROOT / "tests/sso/idp/serve.py")], env=env, cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT)
    provider = IdentityProvider(issuer, client_secret, claims_file, process, json.loads(json.dumps(PEOPLE)))
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the identity provider exited: {(home / 'idp.log').read_text()[-3000:]}")
            try:
                if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the identity provider did not start: {(home / 'idp.log').read_text()[-3000:]}")
            time.sleep(0.1)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture
def oidc_on(idp: IdentityProvider, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Campus sign-in configured as an operator would (environment, read by portal/sso/config.py) and applied
    to the running portal: issuer only, the endpoints from discovery."""
    from django.conf import settings
    from django.test import override_settings

    from portal.sso import discovery
    from portal.sso.config import oidc_settings

    for name, value in {"RECLAIMNET_OIDC_ISSUER": idp.issuer, "RECLAIMNET_OIDC_CLIENT_ID": CLIENT_ID,
                        "RECLAIMNET_OIDC_CLIENT_SECRET": idp.client_secret, "RECLAIMNET_OIDC_ALLOW_HTTP": "1",
                        "RECLAIMNET_OIDC_CAMPUS_NAME": "Campus ID", "RECLAIMNET_OIDC_TIMEOUT_S": "10"}.items():
        monkeypatch.setenv(name, value)
    values = oidc_settings()
    assert values["RECLAIMNET_OIDC_ENABLED"]
    discovery.forget()
    with override_settings(**values, AUTHENTICATION_BACKENDS=[
            *settings.AUTHENTICATION_BACKENDS, "portal.sso.backend.CampusOIDCBackend"]):
        yield values
    discovery.forget()


CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def campus_sign_in(portal: Portal, username: str, session: requests.Session | None = None,
                   next_url: str = "/api/me/") -> tuple[requests.Session, requests.Response]:
    """What a browser does: the portal's "Sign in with …" link, the provider's login form, then back through
    the callback to ``next_url``. Returns the session and the last answer."""
    session = session or requests.Session()
    form = session.get(f"{portal.url}/oidc/authenticate/", params={"next": next_url}, timeout=20)
    if "csrfmiddlewaretoken" not in form.text:  # already signed in at the provider: straight back to the portal
        return session, form
    token = CSRF_INPUT.search(form.text)
    assert token, form.text[:500]
    next_field = re.search(r'name="next" value="([^"]*)"', form.text)
    answer = session.post(form.url, data={"csrfmiddlewaretoken": token.group(1), "username": username,
                                          "password": IDP_PASSWORD,
                                          "next": next_field.group(1).replace("&amp;", "&") if next_field else ""},
                          timeout=20)
    return session, answer
