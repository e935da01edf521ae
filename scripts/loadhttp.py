"""HTTP for the load driver (``scripts/loaddriver.py``): one keep-alive connection with a cookie jar per
client, the portal's HTML forms, and the two ways to sign in (API token, session login form).

Standard library only, so the driver runs from any Python with no install step.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import zlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode, urlsplit

TIMEOUT_S = 120.0


# --- HTTP ----------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int  # 0 = no answer (connection error or timeout)
    headers: dict[str, str]
    body: bytes
    error: str = ""
    ms: float = 0.0

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    @property
    def location(self) -> str:
        return self.headers.get("location", "")


class Http:
    """One keep-alive connection with a cookie jar (one per client thread; not thread-safe)."""

    def __init__(self, base_url: str, timeout_s: float = TIMEOUT_S) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.timeout_s = timeout_s
        self.cookies: dict[str, str] = {}
        self.headers: dict[str, str] = {}
        self.last_levels: list[int] = []  # levels of the flash messages the last answer set (25 ok, 40 error)
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        all_headers = {"Host": f"{self.host}:{self.port}", "Accept": "application/json, text/html", **self.headers,
                       **(headers or {})}
        if self.cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        self.last_levels = []
        started = time.perf_counter()
        try:
            conn = self._connection()
            conn.request(method, path, body=body, headers=all_headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Answer(0, {}, b"", f"{type(exc).__name__}: {exc}", (time.perf_counter() - started) * 1000.0)
        for name, value in resp.getheaders():
            if name.lower() == "set-cookie":
                self._keep_cookie(value)
        if resp.getheader("connection", "").lower() == "close":
            self.close()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, "",
                      (time.perf_counter() - started) * 1000.0)

    def _keep_cookie(self, header: str) -> None:
        pair, _, attrs = header.partition(";")
        name, _, value = pair.strip().partition("=")
        if name == "messages":
            self.last_levels = _message_levels(value)
            return  # not kept: see the module docstring
        expired = "max-age=0" in attrs.lower().replace(" ", "") or (value in ("", '""'))
        if expired:
            self.cookies.pop(name, None)
        else:
            self.cookies[name] = value

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def post_json(self, path: str, payload: Any, headers: dict[str, str] | None = None,
                  method: str = "POST") -> Answer:
        return self.request(method, path, json.dumps(payload).encode(),
                            {"Content-Type": "application/json", **(headers or {})})

    def post_form(self, path: str, fields: list[tuple[str, str]] | dict[str, str]) -> Answer:
        """A browser form POST: CSRF token from the cookie when the fields carry none, Referer = the base URL."""
        items = list(fields.items()) if isinstance(fields, dict) else list(fields)
        if not any(k == "csrfmiddlewaretoken" for k, _ in items) and "csrftoken" in self.cookies:
            items.append(("csrfmiddlewaretoken", self.cookies["csrftoken"]))
        return self.request("POST", path, urlencode(items).encode(), {
            "Content-Type": "application/x-www-form-urlencoded", "Referer": self.base_url + "/",
        })


def _message_levels(cookie: str) -> list[int]:
    """The levels of the messages in Django's signed ``messages`` cookie
    (``[.]base64(json)[:timestamp]:signature``; a leading dot means zlib-compressed)."""
    try:
        payload = cookie.strip('"').split(":", 1)[0]
        compressed = payload.startswith(".")
        payload = payload.lstrip(".")
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        messages = json.loads(zlib.decompress(raw) if compressed else raw)
        return [int(m[2]) for m in messages if isinstance(m, list) and len(m) > 2 and m[0] == "__json_message"]
    except (ValueError, TypeError, zlib.error, IndexError):
        return []


# --- HTML forms ------------------------------------------------------------------------------------------------


@dataclass
class Form:
    action: str
    method: str
    fields: list[tuple[str, str]] = field(default_factory=list)

    def names(self) -> set[str]:
        return {k for k, _ in self.fields}

    def with_values(self, values: dict[str, str]) -> list[tuple[str, str]]:
        """The form's own values (hidden fields, defaults) with ``values`` replacing or adding fields."""
        out = [(k, values.get(k, v)) for k, v in self.fields]
        out += [(k, v) for k, v in values.items() if k not in self.names()]
        return out


class _FormParser(HTMLParser):
    """Every ``<form>`` of a page with the values a browser would submit by default."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._form: Form | None = None
        self._select: tuple[str, list[tuple[str, bool]]] | None = None
        self._option: list[Any] | None = None
        self._textarea: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "form":
            self._form = Form(a.get("action", ""), a.get("method", "get").lower())
            self.forms.append(self._form)
        elif self._form is None:
            return
        elif tag == "input" and a.get("name"):
            kind = a.get("type", "text").lower()
            if kind in ("submit", "button", "image", "reset", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self._form.fields.append((a["name"], a.get("value", "on" if kind == "checkbox" else "")))
        elif tag == "select" and a.get("name"):
            self._select = (a["name"], [])
        elif tag == "option" and self._select is not None:
            self._option = [a.get("value"), "selected" in a, ""]
        elif tag == "textarea" and a.get("name"):
            self._textarea = [a["name"], ""]

    def handle_data(self, data: str) -> None:
        if self._option is not None:
            self._option[2] += data
        if self._textarea is not None:
            self._textarea[1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "option" and self._option is not None and self._select is not None:
            value = self._option[0] if self._option[0] is not None else self._option[2].strip()
            self._select[1].append((value, self._option[1]))
            self._option = None
        elif tag == "select" and self._select is not None and self._form is not None:
            name, options = self._select
            chosen = next((v for v, sel in options if sel), options[0][0] if options else "")
            self._form.fields.append((name, chosen))
            self._select = None
        elif tag == "textarea" and self._textarea is not None and self._form is not None:
            self._form.fields.append((self._textarea[0], self._textarea[1]))
            self._textarea = None
        elif tag == "form":
            self._form = None


def parse_forms(html: bytes | str) -> list[Form]:
    parser = _FormParser()
    parser.feed(html.decode("utf-8", "replace") if isinstance(html, bytes) else html)
    return parser.forms


# --- logging in --------------------------------------------------------------------------------------------------


class LoginError(RuntimeError):
    pass


def api_login(http: Http, username: str, password: str, record: Any = None, attempts: int = 5) -> str:
    """``POST /api/auth/token/``; sets ``Authorization: Token <key>`` on ``http`` and returns the key."""
    last = ""
    for attempt in range(attempts):
        ans = http.post_json("/api/auth/token/", {"username": username, "password": password})
        if record:
            record("api_login", "POST", "/api/auth/token/", ans)
        body = ans.json()
        if ans.status == 200 and isinstance(body, dict) and body.get("token"):
            http.headers["Authorization"] = f"Token {body['token']}"
            return str(body["token"])
        last = f"{ans.status} {ans.error or ans.body[:200]!r}"
        if ans.status and ans.status < 500:
            break
        time.sleep(0.2 * (attempt + 1))
    raise LoginError(f"API login of {username} failed: {last}")


def web_login(http: Http, username: str, password: str, record: Any = None, attempts: int = 5) -> None:
    """The session login form: GET it for the CSRF cookie and token, POST the credentials with a Referer."""
    last = ""
    for attempt in range(attempts):
        page = http.get("/accounts/login/")
        if record:
            record("web_login_form", "GET", "/accounts/login/", page)
        forms = [f for f in parse_forms(page.body) if "csrfmiddlewaretoken" in f.names()] if page.status == 200 else []
        if forms:
            ans = http.post_form("/accounts/login/", forms[0].with_values({"username": username,
                                                                            "password": password}))
            if record:
                record("web_login", "POST", "/accounts/login/", ans)
            if ans.status == 302 and "sessionid" in http.cookies:
                return
            last = f"{ans.status} {ans.error or ans.body[:200]!r}"
            if ans.status and ans.status < 500:
                break
        else:
            last = f"login page {page.status} {page.error}"
        time.sleep(0.2 * (attempt + 1))
    raise LoginError(f"web login of {username} failed: {last}")


