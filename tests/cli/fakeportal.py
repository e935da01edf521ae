"""A tiny HTTP server on loopback that answers as the portal's API does, for the client's unit tests.

It serves the Results contract's shapes (``/api/jobs/{id}/results/``, ``…/results/files/<path>``,
``…/checkpoint/``) from an in-memory dict, and answers scripted statuses for the error and retry tests. Every
request it sees is recorded (method, path, headers, body).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakePortal:
    """State the handler answers from. ``files`` maps a job id to {relative path: bytes}; ``scripted`` maps
    "METHOD path" to a list of (status, headers, body) answered in turn before the normal answer."""

    token: str = "fake-token"
    files: dict[int, dict[str, bytes]] = field(default_factory=dict)
    checkpoints: dict[int, bytes] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)  # results paths served with other bytes than listed
    unsafe_paths: list[str] = field(default_factory=list)  # extra listed paths (e.g. "../x")
    scripted: dict[str, list[tuple[int, dict[str, str], Any]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    jobs_created: int = 0
    url: str = ""

    def listing(self, job_id: int) -> dict[str, Any]:
        entries = []
        for path, data in sorted(self.files.get(job_id, {}).items()):
            entries.append({"path": path, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "download_url": f"/api/jobs/{job_id}/results/files/{urllib.parse.quote(path)}"})
        for path in self.unsafe_paths:
            entries.append({"path": path, "size_bytes": 1, "sha256": "0" * 64,
                            "download_url": f"/api/jobs/{job_id}/results/files/{path}"})
        total = sum(len(data) for data in self.files.get(job_id, {}).values())
        return {"files": entries, "total_bytes": total, "state": "complete" if entries else "none"}


def _handler(portal: FakePortal) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: Any = None, headers: dict[str, str] | None = None,
                    raw: bytes | None = None) -> None:
            data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
            self.send_response(status)
            content_type = "application/octet-stream" if raw is not None else "application/json"
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw_body = self.rfile.read(length) if length else b""
            body = json.loads(raw_body) if raw_body else None
            path = urllib.parse.urlsplit(self.path).path
            portal.seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
            key = f"{self.command} {path}"
            if portal.scripted.get(key):
                status, headers, answer = portal.scripted[key].pop(0)
                self._answer(status, answer, headers)
                return
            if self.headers.get("Authorization") != f"Token {portal.token}":
                self._answer(401, {"detail": "Invalid token."})
                return
            parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
            if self.command == "POST" and path == "/api/auth/token/revoke/":
                portal.token = "revoked-" + portal.token  # the old one answers 401 from now on
                self._answer(204)
                return
            if self.command == "POST" and path == "/api/jobs/":
                portal.jobs_created += 1
                self._answer(201, {"id": portal.jobs_created, "name": body.get("name"), "state": "queued"})
                return
            if len(parts) >= 4 and parts[:2] == ["api", "jobs"] and parts[3] == "results" and len(parts) == 4:
                self._answer(200, portal.listing(int(parts[2])))
                return
            if len(parts) >= 6 and parts[:2] == ["api", "jobs"] and parts[3:5] == ["results", "files"]:
                job_id, relative = int(parts[2]), "/".join(parts[5:])
                data = portal.files.get(job_id, {}).get(relative)
                if data is None:
                    self._answer(404, {"detail": "Not found."})
                    return
                digest = hashlib.sha256(data).hexdigest()
                served = data[:-1] + bytes([data[-1] ^ 1]) if relative in portal.corrupt else data
                self._answer(200, raw=served, headers={"X-Checksum-SHA256": digest})
                return
            if len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "checkpoint":
                data = portal.checkpoints.get(int(parts[2]))
                if data is None:
                    self._answer(404, {"detail": "No checkpoint was kept for this job."})
                    return
                self._answer(200, raw=data, headers={"X-Checksum-SHA256": hashlib.sha256(data).hexdigest()})
                return
            self._answer(404, {"detail": "Not found."})

        do_GET = _handle  # noqa: N815  (BaseHTTPRequestHandler's names)
        do_POST = _handle  # noqa: N815

    return Handler


def serve(portal: FakePortal) -> Iterator[FakePortal]:
    """Run the server in a thread for the duration of a fixture."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(portal))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    portal.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield portal
    finally:
        server.shutdown()
        server.server_close()
