"""``reclaimnet submit --memory 16G --cpus 4`` (design §19.2): sizes read as Slurm and Docker read them (binary),
checked here with a clear usage error, sent as the API's ``memory_bytes`` / ``cpu_cores`` over the spec's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reclaimnet.cli import EXIT_OK, EXIT_USAGE, main
from reclaimnet.spec import parse_memory_bytes, parse_spec
from tests.cli.fakeportal import FakePortal, serve

GIB, MIB, TIB = 2**30, 2**20, 2**40


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    yield from serve(FakePortal())


@pytest.fixture
def spec(tmp_path: Path, portal: FakePortal, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in {"RECLAIMNET_URL": portal.url, "RECLAIMNET_TOKEN": portal.token,
                        "XDG_CONFIG_HOME": str(tmp_path / "config")}.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "job.yaml"
    path.write_text("name: bert\ncommand: python train.py\ngpu_count: 1\nexpected_runtime_s: 1h\n"
                    "ckpt_bytes_estimate: 1GB\n")
    return path


@pytest.mark.parametrize(("text", "size"), [
    ("16G", 16 * GIB), ("16g", 16 * GIB), ("512M", 512 * MIB), ("1.5G", 1536 * MIB), ("1T", TIB),
    ("262144K", 256 * MIB), ("16GiB", 16 * GIB), ("16GB", 16 * 10**9), (" 2 G ", 2 * GIB),
])
def test_memory_sizes_are_binary_with_a_one_letter_unit(text: str, size: int) -> None:
    assert parse_memory_bytes(text) == size


@pytest.mark.parametrize("text", ["16", "lots", "16X", "-1G", "G", ""])
def test_a_memory_size_without_a_unit_or_unreadable_is_none(text: str) -> None:
    assert parse_memory_bytes(text) is None


def test_a_spec_may_give_memory_bytes_as_16g() -> None:
    assert parse_spec("memory_bytes: 16G\ncpu_cores: 4\n") == {"memory_bytes": 16 * GIB, "cpu_cores": 4}
    assert parse_spec("memory_bytes: lots\n") == {"memory_bytes": "lots"}  # the portal names the field


def test_submit_sends_the_options_as_api_fields_over_the_specs(portal: FakePortal, spec: Path) -> None:
    spec.write_text(spec.read_text() + "memory_bytes: 1G\ncpu_cores: 1\n")
    assert main(["submit", str(spec), "--memory", "16G", "--cpus", "0.5"]) == EXIT_OK
    body = [seen.body for seen in portal.seen if seen.method == "POST"][-1]
    assert (body["memory_bytes"], body["cpu_cores"]) == (16 * GIB, 0.5)
    assert main(["submit", str(spec)]) == EXIT_OK  # without the options: the spec's values
    body = [seen.body for seen in portal.seen if seen.method == "POST"][-1]
    assert (body["memory_bytes"], body["cpu_cores"]) == (GIB, 1)


def test_submit_without_the_options_sends_no_limits(portal: FakePortal, spec: Path) -> None:
    assert main(["submit", str(spec)]) == EXIT_OK
    body = [seen.body for seen in portal.seen if seen.method == "POST"][-1]
    assert "memory_bytes" not in body and "cpu_cores" not in body


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--memory", "16", "with its unit"), ("--memory", "lots", "with its unit"), ("--memory", "100M", "256M"),
    ("--memory", "17T", "16T"), ("--cpus", "0", "more than 0"), ("--cpus", "-1", "more than 0"),
    ("--cpus", "2000", "at most 1024"), ("--cpus", "four", "number of cores"), ("--cpus", "nan", "more than 0"),
    ("--cpus", "inf", "at most 1024"),
])
def test_bad_options_are_a_usage_error_naming_the_option_and_nothing_is_sent(
        portal: FakePortal, spec: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
        says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["submit", str(spec), option, value])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert option in err and says in err and repr(value) in err
    assert not any(seen.method == "POST" for seen in portal.seen)


def test_the_help_names_both_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = capsys.readouterr().out
    assert "--memory SIZE" in out and "--cpus N" in out and "16G" in out
