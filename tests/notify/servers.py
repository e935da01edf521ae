"""Real receivers on loopback for the notify tests and benchmark: a threaded HTTP webhook receiver that
checks signatures, and an SMTP server (aiosmtpd)."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from portal.notify import signing


@dataclass
class Received:
    at_s: float  # time.time() when it arrived
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int
    signature_ok: bool | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers each POST with ``status`` after ``delay_s``; ``statuses`` (a list) overrides it request by request.
    ``secret`` set: each request's signature is verified and recorded."""

    status: int = 200
    delay_s: float = 0.0
    statuses: list[int] = field(default_factory=list)
    secret: str | None = None
    received: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = receiver.statuses.pop(0) if receiver.statuses else receiver.status
                headers = {k.lower(): v for k, v in self.headers.items()}  # header names are case-blind
                ok = None
                if receiver.secret is not None:
                    ok = signing.verify(receiver.secret, self.headers.get(signing.TIMESTAMP_HEADER, ""), body,
                                        self.headers.get(signing.SIGNATURE_HEADER, ""))
                receiver.received.append(Received(time.time(), headers, body, status, ok))
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up waiting (its timeout): nobody to answer

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="test-receiver").start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class SmtpSink:
    """A real SMTP server on 127.0.0.1 keeping every message (aiosmtpd)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[dict[str, Any]] = []
        sink = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                sink.messages.append({"at_s": time.time(), "from": envelope.mail_from,
                                      "to": list(envelope.rcpt_tos),
                                      "data": envelope.content.decode("utf-8", "replace")})
                return "250 Message accepted for delivery"

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=port)

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()
