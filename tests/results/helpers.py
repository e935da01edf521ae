"""Speaking the agent side of the results upload protocol from a test (design §14)."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_chunk(client: Client, token: str, job_id: int, path: str, data: bytes, *, offset: int = 0,
              total: int | None = None, checksum: str | None = None, kind: str = "files",
              sequence: int | None = None, whole: bytes | None = None) -> Any:
    """PUT one chunk; ``whole``: the whole file (for its size and sha256) when ``data`` is a part of it."""
    whole = data if whole is None else whole
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_X_CHECKSUM_SHA256": checksum or sha(whole),
               "HTTP_X_TOTAL_SIZE": str(len(whole) if total is None else total), "HTTP_X_OFFSET": str(offset)}
    if sequence is not None:
        headers["HTTP_X_CHECKPOINT_SEQUENCE"] = str(sequence)
    url = f"/api/agent/jobs/{job_id}/results/{kind}/{quote(path, safe='/')}"
    return client.put(url, data=data, content_type="application/octet-stream", **headers)


def upload(client: Client, token: str, job_id: int, path: str, data: bytes, chunk_bytes: int = 1 << 20,
           **kwargs: Any) -> Any:
    """Send a whole file chunk by chunk, resuming where a 409 says (as the agent does); returns the last answer."""
    offset = 0
    while True:
        part = data[offset:offset + chunk_bytes]
        answer = put_chunk(client, token, job_id, path, part, offset=offset, whole=data, **kwargs)
        if answer.status_code == 409:
            offset = answer.json()["offset"]
            continue
        if answer.status_code != 200 or answer.json().get("complete"):
            return answer
        offset = answer.json()["offset"]


def complete(client: Client, token: str, job_id: int, files: list[str], checkpoint: str | None = None) -> Any:
    return client.post(f"/api/agent/jobs/{job_id}/results/complete/", data={"files": files, "checkpoint": checkpoint},
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


def streamed_chunks(response: Any) -> list[bytes]:
    """The chunks of a streaming response, read as its server would: asynchronously when it is async (ASGI)."""
    if not response.is_async:
        return [bytes(chunk) for chunk in response.streaming_content]

    async def collect() -> list[bytes]:
        return [bytes(chunk) async for chunk in response.streaming_content]

    return async_to_sync(collect)()


def asgi_get(user: Any, path: str) -> Any:
    """``GET path`` through Django's ASGI handler (as daphne serves it), signed in as ``user``."""
    client = AsyncClient()
    client.force_login(user)
    return async_to_sync(client.get)(path)


def streamed_body(response: Any) -> bytes:
    return b"".join(streamed_chunks(response))
