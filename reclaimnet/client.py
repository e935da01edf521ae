"""A small client over the portal's REST API, standard library only (design §13).

    from reclaimnet.client import Client
    client = Client.from_env()              # RECLAIMNET_URL / RECLAIMNET_TOKEN, else the config file
    job = client.submit({"name": "bert", "command": "python train.py", "gpu_count": 1,
                         "expected_runtime_s": 3600, "ckpt_bytes_estimate": 3_200_000_000})
    for chunk in client.follow_output(job["id"]):
        print(chunk["text"], end="")
    client.fetch(job["id"], "results/")

Answers are the API's JSON as plain dicts, so fields the portal adds show up without a change here. Errors raise
:class:`ApiError` subclasses by status: :class:`AuthError` (401/403), :class:`NotFound` (404), :class:`Conflict`
(409), :class:`Refused` (other 4xx), :class:`ServerError` (5xx); ``.fields`` holds a 400's field → messages.

Retries are safe by construction. Every write carries an ``Idempotency-Key`` (design §8), one per call and the
same on each of its retries, so a submit retried after a lost answer replays the first answer and never makes a
second job. GETs and keyed writes are retried a few times on 503 (honouring ``Retry-After``) and when the
connection fails; nothing else is retried.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path, PurePosixPath
from typing import Any

from reclaimnet import config

__version__ = "0.1.0"

USER_AGENT = f"reclaimnet-client/{__version__}"
DEFAULT_TIMEOUT_S = 30.0
RETRY_ATTEMPTS = 4  # the first try and three retries
RETRY_AFTER_MAX_S = 30.0  # a longer Retry-After is not waited for: the error is raised instead
FOLLOW_INTERVAL_S = 2.0  # agents ship output every 2 s per job (design §9.11)
PAGE_SIZE = 1000  # the API's largest page
CHUNK_BYTES = 1 << 20
CHECKSUM_HEADER = "X-Checksum-SHA256"


# --- errors ---------------------------------------------------------------------------------------------------


class ApiError(Exception):
    """The portal refused or failed a request. ``status`` is the HTTP status (None when no answer came);
    ``fields`` maps each field of a 400 to its messages (nested fields dotted: ``gpus.0.model``); ``body`` is the
    answer as parsed JSON (or text)."""

    def __init__(self, message: str, status: int | None = None, fields: dict[str, list[str]] | None = None,
                 body: Any = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.fields = fields or {}
        self.body = body
        self.retry_after_s = retry_after_s


class AuthError(ApiError):
    """401 or 403: not signed in, a refused token, or an action your roles do not allow (also a refused
    sign-in at the token endpoint)."""


class NotFound(ApiError):  # noqa: N818  (named after the HTTP answer)
    """404: no such object, or one you may not see."""


class Conflict(ApiError):  # noqa: N818  (named after the HTTP answer)
    """409: the object's state does not allow it (e.g. cancelling a finished job)."""


class Refused(ApiError):  # noqa: N818  (named after the HTTP answer)
    """Any other 4xx: invalid input (400, see ``fields``), a reused idempotency key (422), too many tries (429)."""


class ServerError(ApiError):
    """5xx: the portal failed or is busy."""


class Unreachable(ApiError):  # noqa: N818  (named after the HTTP answer)
    """No answer: the portal could not be reached, or the connection broke."""


class ChecksumMismatch(ApiError):  # noqa: N818  (named after the HTTP answer)
    """A downloaded file's SHA-256 or size is not the one the portal listed; the partial file is removed."""


def _error_class(status: int) -> type[ApiError]:
    if status in (401, 403):
        return AuthError
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status >= 500:
        return ServerError
    return Refused


def flatten_fields(body: Any, prefix: str = "") -> dict[str, list[str]]:
    """A DRF error body as ``{field: [message, …]}``, nested fields dotted (``gpus.0.model``)."""
    fields: dict[str, list[str]] = {}
    if isinstance(body, dict):
        for key, value in body.items():
            if not prefix and key == "detail":
                continue
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict | list) and not (isinstance(value, list) and all(
                    isinstance(item, str) for item in value)):
                fields.update(flatten_fields(value, name))
            else:
                fields.setdefault(name, []).extend(value if isinstance(value, list) else [str(value)])
    elif isinstance(body, list):
        for index, value in enumerate(body):
            if value:
                fields.update(flatten_fields(value, f"{prefix}.{index}" if prefix else str(index)))
    return fields


def _message(status: int, reason: str, body: Any, fields: dict[str, list[str]]) -> str:
    lines = []
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        lines.append(body["detail"])
    lines += [text if field == "non_field_errors" else f"{field}: {text}"
              for field, messages in fields.items() for text in messages]
    if not lines:
        text = body.strip() if isinstance(body, str) else ""
        lines.append(f"HTTP {status} {reason}" + (f": {text[:200]}" if text and not text.startswith("<") else ""))
    return "\n".join(lines)


def _retry_after_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


# --- the client -----------------------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would send the token on to wherever the answer points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Answer:
    """One HTTP answer: status, headers and the body (read whole, or left open as a stream)."""

    def __init__(self, status: int, headers: Any, body: bytes | None, stream: Any = None) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Client:
    """The portal's REST API. ``url`` is the portal's address (``https://gpu.campus.example``), ``token`` an API
    token (from :meth:`login`, or ``/api/auth/token/``)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not re.match(r"^https?://[^/]+", url or ""):
            raise ValueError(f"The portal's address must start with http:// or https://, not {url!r}.")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"  # never the token

    # --- construction -----------------------------------------------------------------------------------------

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """``RECLAIMNET_URL`` and ``RECLAIMNET_TOKEN``, each falling back to the config file that ``reclaimnet
        login`` writes. The stored token is used only for the address it was issued by, so pointing
        ``RECLAIMNET_URL`` elsewhere never sends it to another server."""
        stored = config.load()
        url = os.environ.get("RECLAIMNET_URL") or stored.get("url")
        if not url:
            raise ValueError("No portal address: set RECLAIMNET_URL or run `reclaimnet login`.")
        token = os.environ.get("RECLAIMNET_TOKEN")
        if not token and str(stored.get("url", "")).rstrip("/") == url.rstrip("/"):
            token = stored.get("token")
        return cls(url, token, **kwargs)

    @classmethod
    def login(cls, url: str, username: str, password: str, **kwargs: Any) -> str:
        """Exchange a username and password for an API token (``POST /api/auth/token/``). Wrong credentials raise
        :class:`AuthError` (status 400, the portal's message); too many failures lock out (429, :class:`Refused`)."""
        client = cls(url, None, **kwargs)
        try:
            answer = client._request("POST", "/api/auth/token/", body={"username": username, "password": password})
        except Refused as error:
            if error.status == 400:
                raise AuthError(error.message, error.status, error.fields, error.body) from None
            raise
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise ServerError("The portal's token answer carried no token.", 200, body=answer)
        return token

    def logout(self) -> bool:
        """Revoke this client's token on the portal (``POST /api/auth/token/revoke/``), so it stops working there
        and the next :meth:`login` issues a new one. True when the portal revoked it now, False when it already
        refused the token (401: revoked before, or never valid); other errors raise, e.g. :class:`Unreachable`.
        Sent once (no retry): a caller that cannot reach the portal is told so at once."""
        if not self.token:
            raise ValueError("No token to revoke.")
        try:
            self._request("POST", "/api/auth/token/revoke/")
        except AuthError as error:
            if error.status != 401:
                raise
            revoked = False
        else:
            revoked = True
        self.token = None
        return revoked

    # --- HTTP -------------------------------------------------------------------------------------------------

    def _url(self, path: str, params: dict[str, Any] | None = None) -> str:
        if path.startswith(("http://", "https://")):
            target, base = urllib.parse.urlsplit(path), urllib.parse.urlsplit(self.url)
            if (target.scheme, target.netloc) != (base.scheme, base.netloc):
                raise Refused(f"The portal pointed at another server ({target.netloc}); not following it.")
            full = path
        else:
            full = self.url + "/" + path.lstrip("/")
        query = {key: _param(value) for key, value in (params or {}).items() if value is not None}
        if query:
            full += ("&" if "?" in full else "?") + urllib.parse.urlencode(query)
        return full

    def _send(self, method: str, url: str, data: bytes | None, headers: dict[str, str], stream: bool) -> _Answer:
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            response = self._opener.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as error:
            body = error.read()
            error.close()
            return _Answer(error.code, error.headers, body)
        except OSError as error:  # URLError, refused, reset, timed out
            reason = getattr(error, "reason", error)
            raise Unreachable(f"Cannot reach the portal at {self.url}: {reason}.") from None
        if stream:
            return _Answer(response.status, response.headers, None, response)
        try:
            return _Answer(response.status, response.headers, response.read())
        except OSError as error:  # reset, timed out
            raise Unreachable(f"The connection to {self.url} broke: {error}.") from None
        finally:
            response.close()

    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None,
                 idempotency_key: str | None = None, stream: bool = False, raw: bool = False,
                 accept: str = "application/json") -> Any:
        """Send one request (retried when that is safe); the parsed JSON, or the :class:`_Answer` when ``raw``
        or ``stream``."""
        url = self._url(path, params)
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if method != "GET" and idempotency_key is None and not path.startswith("/api/auth/token/"):
            idempotency_key = new_idempotency_key()
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        retry_safe = method == "GET" or idempotency_key is not None
        for attempt in range(RETRY_ATTEMPTS):
            last = attempt == RETRY_ATTEMPTS - 1
            try:
                answer = self._send(method, url, data, headers, stream)
            except Unreachable:
                if not retry_safe or last:
                    raise
                self._sleep(min(RETRY_AFTER_MAX_S, 0.5 * 2 ** attempt))
                continue
            if 300 <= answer.status < 400:
                if answer.stream is not None:
                    answer.stream.close()
                where = answer.headers.get("Location", "elsewhere")
                raise Refused(f"The portal answered {answer.status}, redirecting to {where}: not followed, so the "
                              "token stays here. Use the address it names as RECLAIMNET_URL.", answer.status)
            if answer.status < 400:
                return answer if raw or stream else answer.json()
            wait_s = _retry_after_s(answer.headers.get("Retry-After"))
            in_progress = answer.status == 409 and idempotency_key is not None and b"Idempotency-Key" in (
                answer.body or b"")
            if retry_safe and not last and (answer.status == 503 or in_progress) and (
                    wait_s is None or wait_s <= RETRY_AFTER_MAX_S):
                self._sleep(wait_s if wait_s is not None else 0.5 * 2 ** attempt)
                continue
            raise self._error(answer, wait_s)
        raise AssertionError("unreachable")  # pragma: no cover  (the loop returns or raises)

    @staticmethod
    def _error(answer: _Answer, wait_s: float | None) -> ApiError:
        text = (answer.body or b"").decode("utf-8", "replace")
        try:
            body: Any = json.loads(text) if text else None
        except ValueError:
            body = text
        fields = flatten_fields(body) if answer.status == 400 else {}
        try:
            reason = HTTPStatus(answer.status).phrase
        except ValueError:
            reason = ""
        return _error_class(answer.status)(_message(answer.status, reason, body, fields), answer.status, fields,
                                           body, wait_s)

    def _pages(self, path: str, params: dict[str, Any], limit: int | None) -> list[dict[str, Any]]:
        """Every item of a paginated list (``limit``/``offset``), at most ``limit`` of them."""
        items: list[dict[str, Any]] = []
        offset = 0
        while limit is None or len(items) < limit:
            page = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(items))
            answer = self._request("GET", path, params={**params, "limit": page, "offset": offset})
            if not isinstance(answer, dict):  # an unpaginated list
                return list(answer)[:limit] if limit is not None else list(answer)
            results = answer.get("results", [])
            items.extend(results)
            offset += len(results)
            if len(results) < page or offset >= int(answer.get("count", offset)):
                break
        return items

    # --- who am I ---------------------------------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """``GET /api/me/``: username, roles, labs and groups."""
        return self._request("GET", "/api/me/")

    def groups(self) -> list[dict[str, Any]]:
        """Your research groups."""
        return self._pages("/api/groups/", {}, None)

    # --- jobs -------------------------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> Any:
        """Submit a job (``POST /api/jobs/``); the answer as the API gives it (a job, or what an array submit
        answers). ``group`` may be an id or a group's name or slug. Pass your own ``idempotency_key`` to make a
        re-run of a whole script safe too; by default each call has its own."""
        body = dict(spec)
        group = body.get("group")
        if isinstance(group, str) and not group.strip().isdigit():
            body["group"] = self._group_id(group)
        elif isinstance(group, str):
            body["group"] = int(group)
        return self._request("POST", "/api/jobs/", body=body, idempotency_key=idempotency_key)

    def _group_id(self, name: str) -> int:
        wanted = name.strip().casefold()
        for group in self.groups():
            if wanted in (str(group.get("name", "")).casefold(), str(group.get("slug", "")).casefold()):
                return int(group["id"])
        raise NotFound(f"group: You are not a member of a research group named {name!r}.", 404,
                       {"group": [f"You are not a member of a research group named {name!r}."]})

    def jobs(self, *, limit: int | None = 100, **filters: Any) -> list[dict[str, Any]]:
        """Your groups' jobs, newest first (``state=``, ``group=`` and any filter the API takes)."""
        return self._pages("/api/jobs/", filters, limit)

    def job(self, id: int) -> dict[str, Any]:
        """One job with its detail fields (e.g. ``waiting_reason``)."""
        return self._request("GET", f"/api/jobs/{_id(id)}/")

    def output(self, id: int, since: int | None = None) -> dict[str, Any]:
        """``GET /api/jobs/{id}/output/``: ``{text, offset, next_offset, truncated, running, size_cap_bytes}``,
        from byte ``since`` (None: everything kept)."""
        return self._request("GET", f"/api/jobs/{_id(id)}/output/", params={"since": since})

    def follow_output(self, id: int, since: int | None = None, *,
                      interval_s: float = FOLLOW_INTERVAL_S) -> Iterator[dict[str, Any]]:
        """Output answers as the job writes, until it ends: yields each answer that has text or reports dropped
        bytes (``truncated``), then a last one with ``running`` false. The state and the output are read together,
        so nothing written before the job ended is missed."""
        while True:
            answer = self.output(id, since)
            since = answer["next_offset"]
            if answer.get("text") or answer.get("truncated") or not answer.get("running"):
                yield answer
            if not answer.get("running"):
                return
            self._sleep(interval_s)

    def cancel(self, id: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Cancel a job (409 :class:`Conflict` when it has already ended)."""
        return self._request("POST", f"/api/jobs/{_id(id)}/cancel/", idempotency_key=idempotency_key)

    # --- results (the Results contract) ------------------------------------------------------------------------

    def results(self, id: int) -> dict[str, Any]:
        """``GET /api/jobs/{id}/results/``: ``{files: [{path, size_bytes, sha256, download_url}], total_bytes,
        state}`` (state: none, partial or complete)."""
        return self._request("GET", f"/api/jobs/{_id(id)}/results/")

    def fetch(self, id: int, dest_dir: str | os.PathLike[str],
              on_file: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Download a job's results into ``dest_dir``, keeping their relative paths; every file is checked against
        the listed SHA-256 and size (and the ``X-Checksum-SHA256`` header) before it takes its name, so a file
        at its final path is always whole. A file already there with the right SHA-256 is not downloaded again.
        Returns the listing with each file's ``local_path`` and ``outcome`` (``downloaded`` or ``unchanged``);
        ``on_file`` is called after each file."""
        listing = self.results(id)
        root = Path(dest_dir)
        root.mkdir(parents=True, exist_ok=True)
        done = []
        for item in listing.get("files", []):
            target = root.joinpath(*_safe_relative(str(item.get("path", ""))).parts)
            expected = str(item.get("sha256", "")).lower()
            if target.is_file() and expected and _sha256_of(target) == expected:
                outcome = "unchanged"
            else:
                url = item.get("download_url") or f"/api/jobs/{_id(id)}/results/files/{item['path']}"
                self._download(_quote_path(str(url)), target, expected, item.get("size_bytes"))
                outcome = "downloaded"
            record = {**item, "local_path": str(target), "outcome": outcome}
            done.append(record)
            if on_file is not None:
                on_file(record)
        return {**listing, "files": done, "dest_dir": str(root)}

    def fetch_checkpoint(self, id: int, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """Download the job's final checkpoint to the file ``dest`` (404 :class:`NotFound` when none was kept),
        checked against ``X-Checksum-SHA256``. Returns ``{path, size_bytes, sha256}``."""
        target = Path(dest)
        size_bytes, digest = self._download(f"/api/jobs/{_id(id)}/checkpoint/", target, "", None)
        return {"path": str(target), "size_bytes": size_bytes, "sha256": digest}

    def _download(self, url: str, target: Path, expected_sha256: str, expected_size: Any) -> tuple[int, str]:
        """Stream ``url`` into a hidden temporary file beside ``target``; rename it only when it checks out."""
        answer = self._request("GET", url, stream=True, accept="application/octet-stream, application/json;q=0.5")
        header = (answer.headers.get(CHECKSUM_HEADER) or "").strip().lower()
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
        digest = hashlib.sha256()
        size_bytes = 0
        try:
            with answer.stream, open(partial, "wb") as handle:
                while chunk := answer.stream.read(CHUNK_BYTES):
                    handle.write(chunk)
                    digest.update(chunk)
                    size_bytes += len(chunk)
            actual = digest.hexdigest()
            for what, wanted in (("the listed SHA-256", expected_sha256), (CHECKSUM_HEADER, header)):
                if wanted and wanted != actual:
                    raise ChecksumMismatch(f"{target.name}: SHA-256 {actual} is not {what} {wanted}; the download "
                                           "was removed.")
            if isinstance(expected_size, int) and expected_size != size_bytes:
                raise ChecksumMismatch(f"{target.name}: {size_bytes} bytes arrived, {expected_size} were listed; "
                                       "the download was removed.")
            os.replace(partial, target)
        except OSError as error:  # reset, timed out
            raise Unreachable(f"The download of {target.name} broke off: {error}.") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
        return size_bytes, actual

    # --- providers --------------------------------------------------------------------------------------------

    def nodes(self, *, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Nodes by name (``mine=True`` for your labs' only; ``state=``, ``provider=``, ``building=``)."""
        return self._pages("/api/nodes/", filters, limit)

    def node_id(self, node: int | str) -> int:
        """A node's id from its id or its name."""
        if isinstance(node, int) or str(node).strip().isdigit():
            return int(node)
        for candidate in self.nodes():
            if candidate.get("name") == node:
                return int(candidate["id"])
        raise NotFound(f"No node is named {node!r}.", 404)

    def reclaim_preview(self, node: int | str, notice_s: float = 0.0) -> dict[str, Any]:
        """What reclaiming with this notice would do to each hosted job, and the shortest loss-free notice."""
        return self._request("GET", f"/api/nodes/{self.node_id(node)}/reclaim-preview/",
                             params={"notice_s": notice_s})

    def reclaim(self, node: int | str, notice_s: float | None = None, emergency: bool = False, *,
                idempotency_key: str | None = None) -> dict[str, Any]:
        """Take a node back: now (``emergency``), with ``notice_s`` seconds of notice, or — neither given — with
        the shortest notice with which no hosted job loses work (the reclaim planner's own answer). Returns the
        reclaim event."""
        node_id = self.node_id(node)
        if emergency:
            return self._request("POST", f"/api/nodes/{node_id}/emergency-reclaim/",
                                 idempotency_key=idempotency_key)
        if notice_s is None:
            shortest = self.reclaim_preview(node_id).get("shortest_loss_free_notice_s")
            if shortest is None:
                raise Refused("No notice up to a week lets every hosted job leave without losing work: give a "
                              "notice or reclaim with emergency.", None)
            notice_s = float(shortest)
        return self._request("POST", f"/api/nodes/{node_id}/reclaim/", body={"notice_s": notice_s},
                             idempotency_key=idempotency_key)

    def lend(self, node: int | str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Lend a reclaimed node again (``lend-again``); it comes online when its agent says hello."""
        return self._request("POST", f"/api/nodes/{self.node_id(node)}/lend-again/",
                             idempotency_key=idempotency_key)


# --- helpers --------------------------------------------------------------------------------------------------


def new_idempotency_key() -> str:
    return f"reclaimnet-{uuid.uuid4()}"


def _id(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"An id is a whole number, not {value!r}.") from None
    if number < 1:
        raise ValueError(f"An id is a whole number of at least 1, not {value!r}.")
    return number


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _safe_relative(path: str) -> PurePosixPath:
    """A results path as a relative path that stays inside the destination (no ``..``, no absolute path)."""
    relative = PurePosixPath(path)
    if not path or "\x00" in path or relative.is_absolute() or not relative.parts or ".." in relative.parts:
        raise Refused(f"The portal listed an unsafe results path {path!r}; not writing it.")
    return relative


def _quote_path(url: str) -> str:
    """Percent-encode what a path may not carry raw (spaces, non-ASCII), leaving escapes already there."""
    return urllib.parse.quote(url, safe="/:%?=&~+@!$'()*,;")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
