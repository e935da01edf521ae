"""The agent's config file: every field validated at load, each error naming its field (design §1, §18)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import ConfigError, build_config, load_config_file

REPO = Path(__file__).resolve().parents[2]
VALID = {"token": "rna_t", "portal": "ws://127.0.0.1:8000/ws/agent/"}


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECLAIMNET_AGENT_TOKEN", raising=False)
    monkeypatch.delenv("RECLAIMNET_AGENT_TOKEN_FILE", raising=False)


def _error(values: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        build_config(values, {}, **kwargs)
    return str(caught.value)


def test_the_example_config_is_valid_apart_from_its_token_path(tmp_path: Path) -> None:
    values = load_config_file(str(REPO / "examples" / "agent.json"))
    token = tmp_path / "agent-token"
    token.write_text("rna_example\n")
    token.chmod(0o600)
    config = build_config({**values, "token_file": str(token)}, {}, strict_token_file=True)
    assert config.token == "rna_example" and config.data_port == 7070 and config.iface == "eth0"
    assert config.simulate_gpus[0].model == "RTX 3090"


def test_unknown_keys_are_refused_and_listed() -> None:
    message = _error({**VALID, "colour": 1, "data_prot": 70})
    assert message.startswith("unknown configuration keys: colour, data_prot") and "data_port" in message


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"portal": "ws://x/"}, "token"),
        ({"token": "rna_t"}, "portal"),
    ],
)
def test_required_fields_must_be_present(values: dict[str, Any], field: str) -> None:
    assert _error(values).startswith(f"{field}: required")


@pytest.mark.parametrize(
    ("values", "field"),
    [  # wrong types: strings are not numbers, numbers not booleans, booleans not integers
        ({"data_port": "7070"}, "data_port"),
        ({"data_port": True}, "data_port"),
        ({"data_port": 70.5}, "data_port"),
        ({"max_message_bytes": "65536"}, "max_message_bytes"),
        ({"heartbeat_interval_s": "2"}, "heartbeat_interval_s"),
        ({"reconnect_max_s": None}, "reconnect_max_s"),
        ({"fence_fraction": True}, "fence_fraction"),
        ({"kill_jobs_on_agent_exit": "yes"}, "kill_jobs_on_agent_exit"),
        ({"data_dir": 5}, "data_dir"),
        ({"base_dir": ""}, "base_dir"),
        ({"data_host": ["0.0.0.0"]}, "data_host"),
        ({"advertise_host": 10}, "advertise_host"),
        ({"iface": 0}, "iface"),
        ({"link_capacity_bytes_per_s": "1e9"}, "link_capacity_bytes_per_s"),
        ({"token": 123}, "token"),
        ({"token": "rna with space"}, "token"),
        ({"portal": 8000}, "portal"),
        ({"simulate_gpus": "2"}, "simulate_gpus"),
        ({"simulate_gpus": [{"model": "X", "vram_gb": "24"}]}, "simulate_gpus[0].vram_gb"),
        ({"simulate_gpus": [{"model": ""}]}, "simulate_gpus[0].model"),
    ],
)
def test_wrong_types_name_the_field(values: dict[str, Any], field: str) -> None:
    assert _error({**VALID, **values}).startswith(f"{field}:")


@pytest.mark.parametrize(
    ("values", "field"),
    [  # out of range
        ({"data_port": 65536}, "data_port"),
        ({"data_port": -1}, "data_port"),
        ({"max_message_bytes": 100}, "max_message_bytes"),
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
        ({"heartbeat_interval_s": float("nan")}, "heartbeat_interval_s"),
        ({"reconnect_min_s": 5, "reconnect_max_s": 1}, "reconnect_min_s"),
        ({"reconnect_max_s": 86400}, "reconnect_max_s"),
        ({"fence_fraction": 1.0}, "fence_fraction"),
        ({"fence_fraction": 0}, "fence_fraction"),
        ({"link_capacity_bytes_per_s": float("inf")}, "link_capacity_bytes_per_s"),
        ({"link_capacity_bytes_per_s": -1}, "link_capacity_bytes_per_s"),
        ({"simulate_gpus": 65}, "simulate_gpus"),
        ({"simulate_gpus": [{"vram_gb": 0}]}, "simulate_gpus[0].vram_gb"),
        ({"enforcement": "ebpf"}, "enforcement"),
        ({"iface": "eth0/../lo"}, "iface"),
        ({"iface": "a-very-long-interface-name"}, "iface"),
    ],
)
def test_values_out_of_range_name_the_field(values: dict[str, Any], field: str) -> None:
    assert _error({**VALID, **values}).startswith(f"{field}:")


@pytest.mark.parametrize(
    "url",
    ["ftp://portal/ws/agent/", "portal:8000", "ws:///ws/agent/", "ws://portal:99999/", "wss://u:p@portal/",
     "ws://portal/ws/agent/?token=rna_x", "ws://portal/#frag"],
)
def test_portal_must_be_a_plain_websocket_url(url: str) -> None:
    assert _error({**VALID, "portal": url}).startswith("portal:")


def test_portal_url_is_normalised_to_the_agent_endpoint() -> None:
    assert build_config({**VALID, "portal": "wss://portal.example.edu"}, {}).portal == \
        "wss://portal.example.edu/ws/agent/"
    assert build_config({**VALID, "portal": "https://p:8443/ws/agent/"}, {}).portal == "wss://p:8443/ws/agent/"


def test_token_file_readable_by_others_is_refused_strictly_and_warned_otherwise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "agent-token"
    token.write_text("rna_secret\n")
    token.chmod(0o640)
    values = {"portal": VALID["portal"], "token_file": str(token)}
    message = _error(values, strict_token_file=True)
    assert message.startswith("token_file:") and "0640" in message and "chmod 600" in message
    with caplog.at_level("WARNING", logger="nodeagent.config"):
        assert build_config(values, {}).token == "rna_secret"
    assert "0640" in caplog.text
    token.chmod(0o600)
    assert build_config(values, {}, strict_token_file=True).token == "rna_secret"


def test_token_file_missing_or_empty_names_the_field(tmp_path: Path) -> None:
    assert _error({"portal": VALID["portal"], "token_file": str(tmp_path / "absent")}).startswith("token_file:")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    assert "is empty" in _error({"portal": VALID["portal"], "token_file": str(empty)})


def test_token_file_from_the_environment_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The systemd unit's EnvironmentFile names the token file; the config need not."""
    token = tmp_path / "agent-token"
    token.write_text("rna_env\n")
    token.chmod(0o600)
    monkeypatch.setenv("RECLAIMNET_AGENT_TOKEN_FILE", str(token))
    assert build_config({"portal": VALID["portal"]}, {}, strict_token_file=True).token == "rna_env"
    token.chmod(0o604)
    assert _error({"portal": VALID["portal"]}, strict_token_file=True).startswith("RECLAIMNET_AGENT_TOKEN_FILE:")


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeagent", "--check-config", str(path)], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def test_check_config_exits_0_when_valid_and_2_naming_the_field(tmp_path: Path) -> None:
    good = tmp_path / "agent.json"
    good.write_text(json.dumps({**VALID, "data_port": 7070, "enforcement": "off"}))
    out = _check_config(good)
    assert out.returncode == 0 and out.stdout.startswith(f"{good}: ok") and "rna_t" not in out.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**VALID, "data_port": "7070"}))
    out = _check_config(bad)
    assert out.returncode == 2 and out.stderr.startswith("error: data_port: must be an integer")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    out = _check_config(broken)
    assert out.returncode == 2 and "not valid JSON" in out.stderr
