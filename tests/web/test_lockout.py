"""Login lockout and bad-token throttling (docs/design.md §11): 10 failures within 15 minutes lock the account
and the address for 15 minutes, on the sign-in page, the Django admin and ``/api/auth/token/``; an address that
sprays wrong API tokens gets 429 too. Time moves by ageing the stored failures (axes) or the injected clock
(token counters), never by sleeping."""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from django.contrib.auth import authenticate
from django.db import connections
from django.db.models import F
from django.test import AsyncClient, Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.core import auth
from tests.portal import factories as f

pytestmark = pytest.mark.django_db

LIMIT = 10
COOLOFF_S = 900.0


@pytest.fixture(autouse=True)
def production_limits(settings: Any) -> None:
    """The suite's default limit is high (all its clients are 127.0.0.1); these tests use production's."""
    settings.RECLAIMNET_LOGIN_FAILURE_LIMIT = LIMIT
    settings.RECLAIMNET_LOGIN_COOLOFF_S = COOLOFF_S


def fresh_address() -> str:
    """An address no other test or earlier run used (the token counters live in the cache, Redis in the
    suite, not in the test's database transaction)."""
    r = secrets.randbits(64)
    return "fd00::" + ":".join(f"{r >> shift & 0xFFFF:x}" for shift in (48, 32, 16, 0))


def user(name: str) -> Any:
    return f.make_user(name, password=f.PASSWORD)


def web_login(client: Client, username: str, password: str, url: str = "/accounts/login/") -> Any:
    return client.post(url, {"username": username, "password": password})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(client: Client, username: str, times: int, url: str = "/accounts/login/") -> list[int]:
    return [web_login(client, username, "wrong-password", url).status_code for _ in range(times)]


def age_failures(seconds: float) -> None:
    """What the passing of ``seconds`` does to axes' counters: every stored failure gets that much older."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


def test_ten_wrong_passwords_lock_the_account_and_the_right_one_is_refused() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    statuses = fail(client, "alice", LIMIT)
    assert statuses[:-1] == [200] * (LIMIT - 1)  # the form again, with its error
    assert statuses[-1] == 429  # the tenth failure locks
    refused = web_login(client, "alice", f.PASSWORD)
    assert refused.status_code == 429 and not signed_in(client)
    text = refused.content.decode()
    assert "Too many failed sign-ins" in text
    assert re.search(r"until <strong>\d\d:\d\d UTC</strong> \(in about 15 minutes\)", text), text
    assert 840 < int(refused["Retry-After"]) <= 900


def test_the_address_is_locked_for_every_account_and_the_account_from_every_address() -> None:
    user("alice")
    user("bob")
    user("carol")
    attacker = fresh_address()
    fail(Client(REMOTE_ADDR=attacker), "alice", LIMIT)

    other_account_same_address = Client(REMOTE_ADDR=attacker)
    assert web_login(other_account_same_address, "bob", f.PASSWORD).status_code == 429
    assert not signed_in(other_account_same_address)

    same_account_other_address = Client(REMOTE_ADDR=fresh_address())
    assert web_login(same_account_other_address, "alice", f.PASSWORD).status_code == 429

    bystander = Client(REMOTE_ADDR=fresh_address())
    assert web_login(bystander, "carol", f.PASSWORD).status_code == 302 and signed_in(bystander)


def test_after_the_cool_off_the_right_password_works() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    fail(client, "alice", LIMIT)
    age_failures(COOLOFF_S - 60)
    assert web_login(client, "alice", f.PASSWORD).status_code == 429  # a minute left
    age_failures(61)
    assert web_login(client, "alice", f.PASSWORD).status_code == 302 and signed_in(client)


def test_attempts_during_a_lockout_do_not_extend_it() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    fail(client, "alice", LIMIT)
    age_failures(COOLOFF_S / 2)
    assert fail(client, "alice", 5) == [429] * 5
    age_failures(COOLOFF_S / 2 + 1)
    assert web_login(client, "alice", f.PASSWORD).status_code == 302


def test_failures_spread_beyond_the_cool_off_do_not_add_up() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    fail(client, "alice", LIMIT - 1)
    age_failures(COOLOFF_S + 1)
    assert fail(client, "alice", LIMIT - 1) == [200] * (LIMIT - 1)
    assert web_login(client, "alice", f.PASSWORD).status_code == 302


def test_a_successful_login_below_the_limit_resets_nothing_of_other_accounts() -> None:
    """An attacker cannot wipe an address's failures by signing in to an account of its own in between."""
    user("victim")
    user("mallory")
    address = fresh_address()
    attacker = Client(REMOTE_ADDR=address)
    assert fail(attacker, "victim", LIMIT - 1) == [200] * (LIMIT - 1)
    own = Client(REMOTE_ADDR=address)
    assert web_login(own, "mallory", f.PASSWORD).status_code == 302
    assert fail(attacker, "victim", 1) == [429]
    assert web_login(Client(REMOTE_ADDR=fresh_address()), "victim", f.PASSWORD).status_code == 429


def test_a_few_mistakes_then_the_right_password_signs_in() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    assert fail(client, "alice", 3) == [200] * 3
    assert web_login(client, "alice", f.PASSWORD).status_code == 302 and signed_in(client)


def test_the_front_door_sign_in_form_is_covered() -> None:
    user("alice")
    client = Client(REMOTE_ADDR=fresh_address())
    assert fail(client, "alice", LIMIT, url="/")[-1] == 429
    assert web_login(client, "alice", f.PASSWORD, url="/").status_code == 429


def test_the_admin_login_is_covered() -> None:
    f.make_user("root", staff=True, password=f.PASSWORD)
    client = Client(REMOTE_ADDR=fresh_address())
    statuses = [client.post("/admin/login/", {"username": "root", "password": "nope", "next": "/admin/"})
                .status_code for _ in range(LIMIT)]
    assert statuses == [200] * (LIMIT - 1) + [429]
    refused = client.post("/admin/login/", {"username": "root", "password": f.PASSWORD, "next": "/admin/"})
    assert refused.status_code == 429 and not signed_in(client)


def test_the_token_endpoint_answers_a_locked_client_with_429_json() -> None:
    user("alice")
    client = APIClient(REMOTE_ADDR=fresh_address())
    answers = [client.post("/api/auth/token/", {"username": "alice", "password": "wrong"}, format="json")
               for _ in range(LIMIT)]
    assert [a.status_code for a in answers] == [400] * (LIMIT - 1) + [429]
    refused = client.post("/api/auth/token/", {"username": "alice", "password": f.PASSWORD}, format="json")
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/json"
    body = refused.json()
    assert "Too many failed sign-ins" in body["detail"] and re.search(r"\d\d:\d\d UTC", body["detail"])
    assert 840 < body["retry_after_s"] <= 900 and refused["Retry-After"] == str(body["retry_after_s"])
    assert not Token.objects.filter(user__username="alice").exists()
    age_failures(COOLOFF_S + 1)
    granted = client.post("/api/auth/token/", {"username": "alice", "password": f.PASSWORD}, format="json")
    assert granted.status_code == 200 and granted.json()["token"]


def test_spraying_wrong_api_tokens_is_answered_429(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now_s": 1_800_000_000.0}
    monkeypatch.setattr(auth, "_now_s", lambda: clock["now_s"])
    good = Token.objects.create(user=user("alice")).key
    address = fresh_address()
    sprayer = APIClient(REMOTE_ADDR=address)
    statuses = [sprayer.get("/api/me/", HTTP_AUTHORIZATION=f"Token guess{i:040d}").status_code
                for i in range(LIMIT)]
    assert statuses == [401] * (LIMIT - 1) + [429]
    locked = sprayer.get("/api/me/", HTTP_AUTHORIZATION=f"Token {good}")  # even a right token, from there
    assert locked.status_code == 429 and locked["Retry-After"] == "900"
    assert "wrong API token" in locked.json()["detail"]
    elsewhere = APIClient(REMOTE_ADDR=fresh_address())
    assert elsewhere.get("/api/me/", HTTP_AUTHORIZATION=f"Token {good}").status_code == 200
    clock["now_s"] += COOLOFF_S - 1
    assert sprayer.get("/api/me/", HTTP_AUTHORIZATION=f"Token {good}")["Retry-After"] == "1"
    clock["now_s"] += 2
    assert sprayer.get("/api/me/", HTTP_AUTHORIZATION=f"Token {good}").status_code == 200


def test_a_few_wrong_tokens_or_none_are_not_throttled() -> None:
    good = Token.objects.create(user=user("alice")).key
    client = APIClient(REMOTE_ADDR=fresh_address())
    assert [client.get("/api/me/", HTTP_AUTHORIZATION="Token wrong").status_code for _ in range(3)] == [401] * 3
    assert client.get("/api/me/", HTTP_AUTHORIZATION=f"Token {good}").status_code == 200
    assert client.get("/api/me/").status_code in (401, 403)  # no token at all: not counted, not throttled


def test_switching_the_lockout_off_stops_both_counters(settings: Any) -> None:
    settings.AXES_ENABLED = False  # RECLAIMNET_LOGIN_LOCKOUT=0
    user("alice")
    client = APIClient(REMOTE_ADDR=fresh_address())
    assert {client.get("/api/me/", HTTP_AUTHORIZATION="Token wrong").status_code for _ in range(LIMIT + 2)} == {401}
    web = Client(REMOTE_ADDR=fresh_address())
    assert set(fail(web, "alice", LIMIT + 2)) == {200}
    assert web_login(web, "alice", f.PASSWORD).status_code == 302


def test_authenticate_without_a_request_is_not_blocked() -> None:
    """Management commands and server-side scripts call ``authenticate()`` with no request."""
    user("alice")
    fail(Client(REMOTE_ADDR=fresh_address()), "alice", LIMIT)
    assert authenticate(username="alice", password=f.PASSWORD) is not None


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_lockout_under_asgi_answers_the_locked_page() -> None:
    """daphne runs the middleware chain asynchronously (axes' async path)."""
    await sync_to_async(user)("alice")
    client = AsyncClient(REMOTE_ADDR=fresh_address())
    try:
        for _ in range(LIMIT):
            await client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
        refused = await client.post("/accounts/login/", {"username": "alice", "password": f.PASSWORD})
    finally:
        await sync_to_async(connections.close_all)()  # the worker thread's connection, before the db is dropped
    assert refused.status_code == 429 and b"Too many failed sign-ins" in refused.content
    assert int(refused["Retry-After"]) > 840


def test_behind_a_proxy_each_client_is_counted_by_its_own_address(settings: Any) -> None:
    """Behind the trusted proxy every request has the proxy's REMOTE_ADDR: a locked address is the client's
    (the last X-Forwarded-For hop, which the proxy wrote), so one attacker does not lock everyone out, and
    hops the client wrote itself further left change nothing."""
    settings.RECLAIMNET_TRUSTED_PROXY_COUNT = 1
    user("bob")
    user("carol")
    proxy, attacker = fresh_address(), fresh_address()
    for i in range(LIMIT):  # a different account and a different forged hop each time
        user(f"target{i}")
        Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=f"203.0.113.{i}, {attacker}").post(
            "/accounts/login/", {"username": f"target{i}", "password": "wrong"})
    locked = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=attacker)
    assert web_login(locked, "bob", f.PASSWORD).status_code == 429
    colleague = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=fresh_address())
    assert web_login(colleague, "carol", f.PASSWORD).status_code == 302


@pytest.mark.parametrize(("remote", "forwarded", "proxies"), [
    ("", None, 0),  # daphne on a Unix socket sets no REMOTE_ADDR
    ("127.0.0.1", "garbage", 1),  # the proxy vouches for something that is not an address
])
def test_a_wrong_password_from_no_usable_address_is_400_not_500(settings: Any, remote: str,
                                                                forwarded: str | None, proxies: int) -> None:
    """Lockout counters are keyed on an address; a request with none usable still gets its 400."""
    settings.RECLAIMNET_TRUSTED_PROXY_COUNT = proxies
    user("nowhere")
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    client = APIClient(REMOTE_ADDR=remote)
    answer = client.post("/api/auth/token/", {"username": "nowhere", "password": "wrong"}, format="json", **extra)
    assert answer.status_code == 400
