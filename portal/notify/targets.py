"""Webhook targets are untrusted (design §12, "Webhook targets"): the portal's workers must not be made to POST to
loopback, the campus network or a cloud metadata service on a user's behalf.

A target URL is vetted twice: when it is registered (:func:`check_registration`, a 400 on the ``url`` field) and
again before each attempt (:func:`vet`), because what a name resolves to may change. Every address the host
resolves to must be public; the request then connects to the vetted address itself (:func:`post`), never to the
name again, so a DNS rebinding between the check and the connection cannot slip through. The Host header and the
TLS server name (SNI and the certificate check) stay the URL's host. ``RECLAIMNET_NOTIFY_ALLOW_PRIVATE_WEBHOOKS``
lets an operator allow private targets (the scheme and credential checks still apply)."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedTargetError(ValueError):
    """A webhook URL the portal will not post to; the message says why, for the user and the delivery log."""


@dataclass(frozen=True)
class Target:
    """A vetted URL: where to connect (``address``) and what to call it (``host``, for Host and SNI)."""

    scheme: str
    host: str
    port: int
    path: str
    address: str


def private_allowed() -> bool:
    return bool(settings.RECLAIMNET_NOTIFY.get("ALLOW_PRIVATE_WEBHOOKS", False))


def parse(url: str) -> SplitResult:
    """The URL's parts; refuses other schemes than http(s), a missing host and credentials in the URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedTargetError("An http:// or https:// URL with a host.")
    if parts.username is not None or parts.password is not None:
        raise RefusedTargetError("A webhook URL may not carry a user name or password; the requests are signed instead.")
    try:
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError as exc:
        raise RefusedTargetError(f"Invalid port: {exc}.") from None
    return parts


def why_forbidden(address: IPAddress) -> str | None:
    """Why the portal must not connect to ``address`` (None: a public address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return why_forbidden(address.ipv4_mapped)
    for flag, what in (("is_unspecified", "an unspecified"), ("is_loopback", "a loopback"),
                       ("is_link_local", "a link-local (cloud metadata)"), ("is_multicast", "a multicast"),
                       ("is_reserved", "a reserved"), ("is_private", "a private")):
        if getattr(address, flag):
            return what
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a private"
    if not address.is_global:
        return "a non-public"
    return None


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (an IP literal: itself), in the resolver's order. The seam tests stub."""
    return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))


def _default_port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def _refuse_any_forbidden(host: str, addresses: list[str]) -> None:
    for text in addresses:
        reason = why_forbidden(ipaddress.ip_address(text.split("%", 1)[0]))
        if reason is not None:
            shown = f"{host} is" if host == text else f"{host} resolves to {text}, which is"
            raise RefusedTargetError(f"{shown} {reason} address; webhooks must point at a public address "
                                f"(an operator may allow private ones with RECLAIMNET_NOTIFY_ALLOW_PRIVATE_WEBHOOKS).")


def check_registration(url: str) -> None:
    """At registration: the shape, and unless private targets are allowed, every address the host resolves to.
    A name that does not resolve yet is taken (each delivery vets it again)."""
    parts = parse(url)
    if private_allowed():
        return
    host = parts.hostname or ""
    try:
        addresses = resolve(host, _default_port(parts))
    except (OSError, UnicodeError):
        return
    _refuse_any_forbidden(host, addresses)


def vet(url: str) -> Target:
    """Before an attempt: resolve once, refuse if any address is not public (unless allowed), and pin the first.
    Raises :class:`RefusedTargetError` (final) or ``OSError`` when the name does not resolve (worth a retry)."""
    parts = parse(url)
    host, port = parts.hostname or "", _default_port(parts)
    addresses = resolve(host, port)
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    if not private_allowed():
        _refuse_any_forbidden(host, addresses)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, path, addresses[0].split("%", 1)[0])


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Plain HTTP to ``address``; the Host header names the URL's host."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self.pinned_address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.pinned_address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to ``address``; SNI and the certificate check use the URL's host."""

    def __init__(self, target: Target, timeout_s: float, context: ssl.SSLContext | None = None) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s,
                         context=context or ssl.create_default_context())
        self.pinned_address = target.address

    def connect(self) -> None:
        raw = socket.create_connection((self.pinned_address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)


def connection(target: Target, timeout_s: float) -> http.client.HTTPConnection:
    """A connection to the vetted address of ``target`` (no proxy, no redirect following)."""
    if target.scheme == "https":
        return _PinnedHTTPSConnection(target, timeout_s)
    return _PinnedHTTPConnection(target, timeout_s)


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """Vet ``url`` and POST ``body`` to its vetted address; returns the status code (a 3xx is the answer: no
    redirect is followed). Raises :class:`RefusedTargetError`, or ``OSError`` on network errors and timeouts
    (``timeout_s`` per connect and per read)."""
    target = vet(url)
    conn = connection(target, timeout_s)
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(4096)
        return int(response.status)
    finally:
        conn.close()
