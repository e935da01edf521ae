"""The Python client against a fake portal on loopback (design §13): results fetched and checked against their
SHA-256 (the Results contract's shapes), errors mapped to exceptions, retries that never make two jobs, the
spec reader and the config file's mode. No Django and no database here."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reclaimnet import config
from reclaimnet.cli import main
from reclaimnet.client import (
    AuthError,
    ChecksumMismatch,
    Client,
    Conflict,
    NotFound,
    Refused,
    ServerError,
    Unreachable,
)
from reclaimnet.spec import SpecError, parse_duration_s, parse_size_bytes, parse_spec
from tests.cli.fakeportal import FakePortal, serve

EXE = Path(sys.executable).parent / "reclaimnet"


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    yield from serve(FakePortal())


def _client(portal: FakePortal, sleeps: list[float] | None = None) -> Client:
    return Client(portal.url, portal.token, sleep=(sleeps.append if sleeps is not None else lambda _s: None))


RESULTS = {"metrics.json": b'{"loss": 0.41}\n', "plots/loss curve.png": bytes(range(256)) * 40,
           "model/weights.bin": os.urandom(300_000)}


def test_fetch_downloads_every_result_byte_identical_keeping_its_path(portal: FakePortal, tmp_path: Path) -> None:
    portal.files[7] = dict(RESULTS)
    fetched = _client(portal).fetch(7, tmp_path / "out")
    assert fetched["state"] == "complete" and len(fetched["files"]) == 3
    for path, data in RESULTS.items():
        assert (tmp_path / "out" / path).read_bytes() == data
    assert {item["outcome"] for item in fetched["files"]} == {"downloaded"}
    assert not list((tmp_path / "out").rglob(".*.part"))


def test_fetch_again_skips_files_already_there_with_the_right_sha256(portal: FakePortal, tmp_path: Path) -> None:
    portal.files[7] = dict(RESULTS)
    client = _client(portal)
    client.fetch(7, tmp_path)
    (tmp_path / "metrics.json").write_bytes(b"edited\n")
    downloads_before = sum("/results/files/" in seen.path for seen in portal.seen)
    again = client.fetch(7, tmp_path)
    outcomes = {item["path"]: item["outcome"] for item in again["files"]}
    assert outcomes == {"metrics.json": "downloaded", "plots/loss curve.png": "unchanged",
                        "model/weights.bin": "unchanged"}
    assert sum("/results/files/" in seen.path for seen in portal.seen) == downloads_before + 1
    assert (tmp_path / "metrics.json").read_bytes() == RESULTS["metrics.json"]


def test_a_file_that_does_not_match_its_sha256_is_refused_and_removed(portal: FakePortal, tmp_path: Path) -> None:
    portal.files[7] = {"a.txt": b"hello\n"}
    portal.corrupt.add("a.txt")
    with pytest.raises(ChecksumMismatch, match="SHA-256"):
        _client(portal).fetch(7, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b"])
def test_a_results_path_outside_the_destination_is_never_written(portal: FakePortal, tmp_path: Path,
                                                                 path: str) -> None:
    portal.unsafe_paths.append(path)
    with pytest.raises(Refused, match="unsafe results path"):
        _client(portal).fetch(7, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_fetch_checkpoint_checks_the_header_and_a_missing_one_is_not_found(portal: FakePortal,
                                                                           tmp_path: Path) -> None:
    portal.checkpoints[7] = os.urandom(50_000)
    got = _client(portal).fetch_checkpoint(7, tmp_path / "ck" / "final.pt")
    assert (tmp_path / "ck" / "final.pt").read_bytes() == portal.checkpoints[7]
    assert got["sha256"] == hashlib.sha256(portal.checkpoints[7]).hexdigest() and got["size_bytes"] == 50_000
    with pytest.raises(NotFound, match="No checkpoint was kept"):
        _client(portal).fetch_checkpoint(8, tmp_path / "none.pt")
    assert not (tmp_path / "none.pt").exists()


@pytest.mark.parametrize(("status", "body", "error"), [
    (400, {"gpu_count": ["Ensure this value is less than or equal to 16."]}, Refused),
    (401, {"detail": "Invalid token."}, AuthError),
    (403, {"detail": "You do not have permission to perform this action."}, AuthError),
    (404, {"detail": "Not found."}, NotFound),
    (409, {"detail": "job is completed: cannot cancel.", "state": ["job is completed: cannot cancel."]}, Conflict),
    (422, {"Idempotency-Key": ["Key 'k' was already used with a different request."]}, Refused),
    (429, {"detail": "Too many failed sign-ins."}, Refused),
    (500, None, ServerError),
])
def test_answers_map_to_exceptions_by_status(portal: FakePortal, status: int, body: Any,
                                             error: type[Exception]) -> None:
    portal.scripted["POST /api/jobs/"] = [(status, {}, body)]
    with pytest.raises(error) as raised:
        _client(portal).submit({"name": "x"})
    assert raised.value.status == status  # type: ignore[attr-defined]
    if status == 400:
        assert raised.value.fields == body  # type: ignore[attr-defined]
        assert str(raised.value) == "gpu_count: Ensure this value is less than or equal to 16."


def test_nested_field_errors_are_named_with_dots(portal: FakePortal) -> None:
    portal.scripted["POST /api/jobs/"] = [(400, {}, {"after_ok": {"1": ["No job 99 of yours."]}})]
    with pytest.raises(Refused) as raised:
        _client(portal).submit({"name": "x", "after_ok": [5, 99]})
    assert raised.value.fields == {"after_ok.1": ["No job 99 of yours."]}


def test_a_busy_portal_is_retried_after_its_retry_after_for_a_get(portal: FakePortal) -> None:
    portal.files[7] = {"a": b"a"}
    portal.scripted["GET /api/jobs/7/results/"] = [(503, {"Retry-After": "2"}, {"detail": "busy"}),
                                                   (503, {"Retry-After": "1"}, {"detail": "busy"})]
    sleeps: list[float] = []
    assert _client(portal, sleeps).results(7)["state"] == "complete"
    assert sleeps == [2.0, 1.0]


def test_a_portal_busy_for_longer_than_the_retries_raises_server_error(portal: FakePortal) -> None:
    portal.scripted["GET /api/jobs/7/results/"] = [(503, {"Retry-After": "1"}, {"detail": "busy"})] * 4
    with pytest.raises(ServerError) as raised:
        _client(portal).results(7)
    assert raised.value.status == 503 and raised.value.retry_after_s == 1.0


def test_a_retried_submit_sends_the_same_idempotency_key_and_makes_one_job(portal: FakePortal) -> None:
    portal.scripted["POST /api/jobs/"] = [(503, {"Retry-After": "0"}, {"detail": "busy"})]
    job = _client(portal).submit({"name": "bert"})
    posts = [seen for seen in portal.seen if seen.method == "POST"]
    assert job["id"] == 1 and portal.jobs_created == 1 and len(posts) == 2
    keys = {seen.headers["Idempotency-Key"] for seen in posts}
    assert len(keys) == 1 and len(keys.pop()) > 20


def test_each_submit_has_its_own_key_unless_the_caller_gives_one(portal: FakePortal) -> None:
    client = _client(portal)
    client.submit({"name": "a"})
    client.submit({"name": "b"})
    client.submit({"name": "c"}, idempotency_key="nightly-2026-12-02")
    keys = [seen.headers["Idempotency-Key"] for seen in portal.seen if seen.method == "POST"]
    assert len(set(keys[:2])) == 2 and keys[2] == "nightly-2026-12-02"


def test_a_write_that_is_refused_is_not_retried(portal: FakePortal) -> None:
    portal.scripted["POST /api/jobs/"] = [(400, {}, {"name": ["This field is required."]})]
    with pytest.raises(Refused):
        _client(portal).submit({})
    assert sum(seen.method == "POST" for seen in portal.seen) == 1


def test_an_unreachable_portal_raises_unreachable() -> None:
    client = Client("http://127.0.0.1:9", "t", sleep=lambda _s: None)
    with pytest.raises(Unreachable, match="Cannot reach the portal"):
        client.results(1)


def test_the_token_never_follows_a_redirect(portal: FakePortal) -> None:
    portal.scripted["GET /api/jobs/7/"] = [(302, {"Location": "http://elsewhere.example/api/jobs/7/"}, None)]
    with pytest.raises(Refused):
        _client(portal).job(7)
    assert len([seen for seen in portal.seen if seen.path == "/api/jobs/7/"]) == 1


def test_the_cli_fetches_results_and_exits_1_on_a_bad_checksum(portal: FakePortal, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    portal.files[7] = dict(RESULTS)
    env = {"RECLAIMNET_URL": portal.url, "RECLAIMNET_TOKEN": portal.token, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["fetch", "7", "-o", str(tmp_path / "out")]) == 0  # in this process: milliseconds
    fetched = capsys.readouterr().out
    assert "3 files" in fetched and "SHA-256 checked" in fetched
    assert all((tmp_path / "out" / path).read_bytes() == data for path, data in RESULTS.items())
    assert main(["results", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == sum(len(d) for d in RESULTS.values())
    portal.corrupt.add("metrics.json")
    bad = subprocess.run([str(EXE), "fetch", "7", "-o", str(tmp_path / "again")], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=30)  # the console script's exit status
    assert bad.returncode == 1 and "SHA-256" in bad.stderr
    assert not (tmp_path / "again" / "metrics.json").exists()


# --- specs and the config file --------------------------------------------------------------------------------


def test_durations_and_sizes_in_a_spec_become_seconds_and_bytes() -> None:
    spec = parse_spec("name: bert\nexpected_runtime_s: 1h30m\nloss_budget_s: 10m\nckpt_bytes_estimate: 3.2GB\n"
                      "restart_s: 45\narray: 0-49%8\nafter_ok: [3, 4]\n")
    assert spec == {"name": "bert", "expected_runtime_s": 5400.0, "loss_budget_s": 600.0,
                    "ckpt_bytes_estimate": 3_200_000_000, "restart_s": 45, "array": "0-49%8", "after_ok": [3, 4]}
    assert parse_size_bytes("1 GiB") == 2**30 and parse_size_bytes("12") is None
    assert parse_duration_s("2d") == 172800.0 and parse_duration_s("soon") is None


def test_a_string_that_is_not_a_duration_passes_through_for_the_portal_to_name() -> None:
    assert parse_spec("expected_runtime_s: a while\n") == {"expected_runtime_s": "a while"}


@pytest.mark.parametrize("text", ["name: [unclosed\n", "- a\n- b\n", "", "just text\n", "1: x\n"])
def test_a_spec_that_is_not_a_mapping_of_fields_is_a_spec_error(text: str) -> None:
    with pytest.raises(SpecError):
        parse_spec(text)


def test_the_config_file_is_created_0600_even_with_a_permissive_umask(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    modes: list[int] = []
    real_open = os.open

    def spy_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT:
            modes.append(mode)
            assert flags & os.O_EXCL  # a fresh file: never an existing one with other permissions
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_open)
    old = os.umask(0)
    try:
        path = config.save({"url": "http://127.0.0.1:8000", "token": "secret"})
        config.save({"url": "http://127.0.0.1:8000", "token": "newer"})
    finally:
        os.umask(old)
    assert modes == [0o600, 0o600]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert config.load()["token"] == "newer" and [p.name for p in path.parent.iterdir()] == ["config.json"]


def test_a_stored_token_is_never_sent_to_another_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("RECLAIMNET_TOKEN", raising=False)
    config.save({"url": "https://gpu.campus.example", "token": "secret"})
    monkeypatch.delenv("RECLAIMNET_URL", raising=False)
    assert Client.from_env().token == "secret"
    monkeypatch.setenv("RECLAIMNET_URL", "https://evil.example")
    assert Client.from_env().token is None


def test_the_client_and_the_cli_never_import_django() -> None:
    code = "import sys, reclaimnet.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stderr


def test_logout_revokes_the_token_once_and_a_second_time_finds_it_refused(portal: FakePortal) -> None:
    old = portal.token
    client = _client(portal)
    assert client.logout() is True and client.token is None
    revoke = portal.seen[-1]
    assert (revoke.method, revoke.path) == ("POST", "/api/auth/token/revoke/")
    assert revoke.headers["Authorization"] == f"Token {old}" and "Idempotency-Key" not in revoke.headers
    assert Client(portal.url, old).logout() is False  # already revoked: 401, nothing left to do
    with pytest.raises(AuthError):
        Client(portal.url, old).me()


def test_logout_when_the_portal_is_unreachable_raises_without_retrying() -> None:
    sleeps: list[float] = []
    client = Client("http://127.0.0.1:9", "some-token", sleep=sleeps.append)
    with pytest.raises(Unreachable):
        client.logout()
    assert sleeps == [] and client.token == "some-token"
