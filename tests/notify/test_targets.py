"""Webhook targets are untrusted (design §12): loopback, private, link-local, multicast, unspecified and reserved
addresses are refused at registration and again before each attempt, the connection goes to the vetted address,
and only an operator's setting allows private targets. The test suite runs with that setting on (its receivers
listen on 127.0.0.1); these tests turn it off."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.core.models import OutboxMessage
from portal.notify import dispatch, targets
from portal.notify.api import create_webhook
from portal.notify.models import Attempt, Delivery, DeliveryStatus, Webhook
from tests.notify.conftest import World
from tests.notify.servers import Receiver

PUBLIC_V4, PUBLIC_V6 = "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"

FORBIDDEN = {  # URL: what the refusal calls it
    "http://127.0.0.1:8000/hook": "loopback",
    "http://127.9.9.9/hook": "loopback",
    "http://[::1]/hook": "loopback",
    "http://[::ffff:127.0.0.1]/hook": "loopback",
    "http://10.1.2.3/hook": "private",
    "http://172.16.0.9/hook": "private",
    "https://192.168.1.20/hook": "private",
    "http://[fd12:3456::1]/hook": "private",
    "http://169.254.169.254/latest/meta-data/": "link-local",
    "http://[fe80::1]/hook": "link-local",
    "http://224.0.0.1/hook": "multicast",
    "http://0.0.0.0/hook": "unspecified",
    "http://[::]/hook": "unspecified",
    "http://240.0.0.1/hook": "reserved",
    "http://localhost:8000/hook": "loopback",  # a name resolving to 127.0.0.1
}


@pytest.fixture
def private_refused(settings: Any) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "ALLOW_PRIVATE_WEBHOOKS": False}


def _resolving_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> list[str]:
    """Stub the resolver: every name resolves to ``addresses``; returns the list of names asked for."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return list(addresses)

    monkeypatch.setattr(targets, "resolve", resolve)
    return asked


# --- the address classes ---------------------------------------------------------------------------------------

@pytest.mark.usefixtures("private_refused")
@pytest.mark.parametrize(("url", "what"), FORBIDDEN.items())
def test_loopback_private_link_local_multicast_unspecified_and_reserved_targets_are_refused(
        url: str, what: str) -> None:
    with pytest.raises(targets.RefusedTargetError, match=what):
        targets.check_registration(url)
    with pytest.raises(targets.RefusedTargetError, match=what):
        targets.vet(url)


@pytest.mark.usefixtures("private_refused")
def test_a_public_address_is_taken_and_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolving_to(monkeypatch, PUBLIC_V4, PUBLIC_V6)
    targets.check_registration("https://hooks.example.org/in")
    target = targets.vet("https://hooks.example.org/in?team=nlp")
    assert target == targets.Target("https", "hooks.example.org", 443, "/in?team=nlp", PUBLIC_V4)


@pytest.mark.usefixtures("private_refused")
def test_a_name_with_any_private_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolving_to(monkeypatch, PUBLIC_V4, "10.0.0.5")
    with pytest.raises(targets.RefusedTargetError, match=r"hooks\.example\.org resolves to 10\.0\.0\.5.*private"):
        targets.vet("https://hooks.example.org/in")


@pytest.mark.parametrize("url", ["ftp://hooks.example.org/x", "file:///etc/passwd", "gopher://h.example/",
                                 "https://user:pw@hooks.example.org/x", "https://token@hooks.example.org/x",
                                 "http:///no-host"])
def test_other_schemes_and_credentials_in_the_url_are_refused_even_when_private_targets_are_allowed(
        url: str) -> None:
    with pytest.raises(targets.RefusedTargetError):
        targets.check_registration(url)


def test_an_operator_may_allow_private_targets(settings: Any) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "ALLOW_PRIVATE_WEBHOOKS": True}
    targets.check_registration("http://10.1.2.3/hook")
    assert targets.vet("http://localhost:8000/hook").address in ("127.0.0.1", "::1")


# --- registration: API and settings page -----------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.usefixtures("private_refused")
@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/hook", "http://[::1]/hook", "http://192.168.1.20/hook",
                                 "http://169.254.169.254/latest/meta-data/", "http://localhost:8000/hook"])
def test_the_api_refuses_a_private_target_with_a_400_naming_the_url_field(world: World, url: str) -> None:
    c = APIClient()
    c.force_authenticate(world.researcher)
    answer = c.post("/api/notify/webhooks/", {"url": url}, format="json")
    assert answer.status_code == 400
    assert "public address" in " ".join(answer.json()["url"])
    hook = create_webhook(world.researcher, url="https://hooks.example.org/ok")
    assert c.patch(f"/api/notify/webhooks/{hook.pk}/", {"url": url}, format="json").status_code == 400
    assert not Webhook.objects.filter(url=url).exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("private_refused")
def test_the_api_takes_a_public_target(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _resolving_to(monkeypatch, PUBLIC_V4)
    c = APIClient()
    c.force_authenticate(world.researcher)
    answer = c.post("/api/notify/webhooks/", {"url": "https://hooks.example.org/in"}, format="json")
    assert answer.status_code == 201 and asked == ["hooks.example.org"]


@pytest.mark.django_db
@pytest.mark.usefixtures("private_refused")
def test_the_settings_page_refuses_a_private_target_with_a_400_naming_the_url_field(world: World) -> None:
    c = Client()
    c.force_login(world.researcher)
    answer = c.post("/notify/webhooks/new/", {"url": "http://169.254.169.254/latest/meta-data/", "name": "x",
                                               "owner": "me", "submit_token": "t-ssrf"})
    html = answer.content.decode()
    assert answer.status_code == 400 and "link-local" in html and "public address" in html
    assert not Webhook.objects.exists()


# --- delivery --------------------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.usefixtures("private_refused")
def test_a_delivery_to_a_private_target_is_refused_logged_and_not_retried(world: World,
                                                                         receiver: Receiver) -> None:
    hook = create_webhook(world.researcher, url=receiver.url)  # registered before the rule, or the DNS changed
    delivery = dispatch.send_test(hook, world.researcher, "webhook")
    OutboxMessage.objects.all().delete()
    assert dispatch.attempt_delivery(delivery.pk, 1) == "gave up"
    delivery.refresh_from_db()
    [attempt] = Attempt.objects.filter(delivery=delivery)
    assert delivery.status == DeliveryStatus.GAVE_UP and delivery.last_error.startswith(dispatch.REFUSED)
    assert "127.0.0.1" in attempt.error and "loopback" in attempt.error and attempt.status_code is None
    assert not OutboxMessage.objects.exists() and receiver.received == []


@pytest.mark.django_db
@pytest.mark.usefixtures("private_refused")
def test_a_name_that_rebinds_to_loopback_at_delivery_is_refused(world: World, receiver: Receiver,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _resolving_to(monkeypatch, PUBLIC_V4)
    url = receiver.url.replace("127.0.0.1", "hooks.example.org")
    hook = create_webhook(world.researcher, url=url)
    _resolving_to(monkeypatch, "127.0.0.1")
    delivery = dispatch.send_test(hook, world.researcher, "webhook")
    assert dispatch.attempt_delivery(delivery.pk, 1) == "gave up"
    assert receiver.received == [] and "resolves to 127.0.0.1" in Delivery.objects.get(pk=delivery.pk).last_error


@pytest.mark.usefixtures("private_refused")
def test_the_connection_goes_to_the_vetted_address_and_the_name_is_not_resolved_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _resolving_to(monkeypatch, PUBLIC_V4)
    connected: list[tuple[str, int]] = []

    def no_second_lookup(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the name was resolved again")

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        connected.append(address)
        raise ConnectionRefusedError("stubbed")

    monkeypatch.setattr(socket, "getaddrinfo", no_second_lookup)
    monkeypatch.setattr(targets.socket, "create_connection", create_connection)
    with pytest.raises(ConnectionRefusedError):
        targets.post("https://hooks.example.org:8443/in", b"{}", {}, 1.0)
    assert asked == ["hooks.example.org"] and connected == [(PUBLIC_V4, 8443)]


def test_tls_names_the_urls_host_for_sni_and_the_certificate_check(monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped: dict[str, Any] = {}

    class Context:
        post_handshake_auth = None
        verify_mode = ssl.CERT_REQUIRED
        check_hostname = True

        def set_alpn_protocols(self, protocols: list[str]) -> None:
            pass

        def wrap_socket(self, sock: Any, server_hostname: str | None = None) -> Any:
            wrapped.update(sock=sock, server_hostname=server_hostname)
            raise OSError("stubbed handshake")

    monkeypatch.setattr(targets.socket, "create_connection", lambda address, timeout: ("raw", address))
    target = targets.Target("https", "hooks.example.org", 443, "/in", PUBLIC_V4)
    conn = targets._PinnedHTTPSConnection(target, 1.0, context=Context())  # type: ignore[arg-type]
    with pytest.raises(OSError, match="stubbed handshake"):
        conn.connect()
    assert wrapped == {"sock": ("raw", (PUBLIC_V4, 443)), "server_hostname": "hooks.example.org"}
    real = targets.connection(target, 1.0)
    assert real._context.check_hostname and real._context.verify_mode == ssl.CERT_REQUIRED  # type: ignore[attr-defined]


def test_the_host_header_names_the_urls_host_not_the_address(settings: Any, monkeypatch: pytest.MonkeyPatch,
                                                             receiver: Receiver) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "ALLOW_PRIVATE_WEBHOOKS": True}
    _resolving_to(monkeypatch, "127.0.0.1")
    url = receiver.url.replace("127.0.0.1", "hooks.example.org")
    assert targets.post(url, b"{}", {"Content-Type": "application/json"}, 2.0) == 200
    [got] = receiver.received
    assert got.headers["host"] == url.split("/")[2]


def test_private_targets_are_refused_by_default_outside_the_test_suite() -> None:
    from tests.web.test_security_settings import production_env, settings_in

    assert settings_in(production_env(), "RECLAIMNET_NOTIFY")["RECLAIMNET_NOTIFY"]["ALLOW_PRIVATE_WEBHOOKS"] is False
    allowed = production_env(RECLAIMNET_NOTIFY_ALLOW_PRIVATE_WEBHOOKS="1")
    assert settings_in(allowed, "RECLAIMNET_NOTIFY")["RECLAIMNET_NOTIFY"]["ALLOW_PRIVATE_WEBHOOKS"] is True
