"""An agent lists several portal addresses (design §18: a portal of several daphne processes): ``portal`` is one
URL or a list, each normalised and checked as one URL is, a mistake naming ``portal[i]``; the connect loop tries
them in turn when a connection fails or ends, with the usual reconnect backoff."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodeagent.__main__ import main, parse_args
from nodeagent.config import ConfigError, build_config

BASE = {"token": "t", "enforcement": "off", "confinement": "off", "allow_unconfined_jobs": True}


def _config(tmp_path: Path, portal: Any) -> Any:
    return build_config({**BASE, "portal": portal, "data_dir": str(tmp_path / "data")}, {})


def test_one_url_stays_the_single_portal(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "http://h:8000")
    assert cfg.portal == "ws://h:8000/ws/agent/"
    assert cfg.portal_urls == ("ws://h:8000/ws/agent/",)


def test_a_list_is_normalised_in_order_and_the_first_is_portal(tmp_path: Path) -> None:
    cfg = _config(tmp_path, ["ws://a:8001", "https://b:8443/ws/agent/", "ws://a:8001/ws/agent/"])
    assert cfg.portal_urls == ("ws://a:8001/ws/agent/", "wss://b:8443/ws/agent/")  # the duplicate dropped
    assert cfg.portal == "ws://a:8001/ws/agent/"


@pytest.mark.parametrize(("portal", "message"), [
    (["ws://a:8001", "ftp://b"], "portal[1]: expected a ws:// or wss:// URL"),
    (["ws://a:99999"], "portal[0]: bad port"),
    (["ws://u:p@a"], "portal[0]: must not carry credentials"),
    (["ws://a", "ws://b/?x=1"], "portal[1]: must not have a query"),
    (["ws://a", 7], "portal[1]: must be a non-empty string"),
    (["ws://a", ""], "portal[1]: must be a non-empty string"),
    ([], "portal: the list is empty"),
    ({"url": "ws://a"}, "portal: must be a URL or a list of URLs"),
    (["ws://a"] * 17, "portal: at most 16 URLs"),
    ("gopher://a", "portal: expected a ws:// or wss:// URL"),
])
def test_a_bad_entry_is_refused_naming_its_index(tmp_path: Path, portal: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, portal)
    assert str(info.value).startswith(message), str(info.value)


def test_portals_is_not_a_config_key_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown configuration keys: portals"):
        build_config({**BASE, "portal": "ws://a", "portals": ["ws://b"]}, {})


def test_the_command_line_takes_portal_more_than_once() -> None:
    args = parse_args(["--portal", "ws://a:1", "--portal", "ws://b:2"])
    cfg = build_config({}, {"portal": args.portal, "token": "t"})
    assert cfg.portal_urls == ("ws://a:1/ws/agent/", "ws://b:2/ws/agent/")
    one = build_config({}, {"portal": parse_args(["--portal", "ws://a:1"]).portal, "token": "t"})
    assert one.portal_urls == ("ws://a:1/ws/agent/",) and one.portal == "ws://a:1/ws/agent/"


def test_check_config_prints_every_portal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "agent.json"
    cfg.write_text('{"portal": ["ws://a:1", "ws://b:2"], "enforcement": "off"}')
    monkeypatch.setenv("RECLAIMNET_AGENT_TOKEN", "t")
    assert main(["--check-config", str(cfg)]) == 0
    assert "portal ws://a:1/ws/agent/, ws://b:2/ws/agent/" in capsys.readouterr().out


def test_next_portal_index_wraps_round() -> None:
    from nodeagent.agent import next_portal_index

    assert [next_portal_index(i, 3) for i in range(3)] == [1, 2, 0]
    assert next_portal_index(0, 1) == 0


def test_the_connect_loop_tries_each_portal_in_turn_with_backoff(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Three failed connections go to a, b, a; each wait between them is the reconnect backoff's."""
    from nodeagent import agent as agent_module
    from nodeagent.agent import Agent

    urls = ["ws://127.0.0.1:1/ws/agent/", "ws://127.0.0.1:2/ws/agent/"]
    agent = Agent(_config(tmp_path, urls))
    tried: list[str] = []
    delays: list[float] = []
    real_delay = agent_module.reconnect_delay_s

    def delay(*args: Any) -> float:
        delays.append(real_delay(*args))
        return 0.0

    async def session() -> None:
        tried.append(agent.portal_url)
        if len(tried) == 3:
            agent.stopping.set()
        raise OSError("connection refused")

    monkeypatch.setattr(agent_module, "reconnect_delay_s", delay)
    monkeypatch.setattr(agent, "_session", session)
    assert asyncio.run(agent.run()) == 0
    assert tried == [urls[0], urls[1], urls[0]]
    assert len(delays) == 3 and all(0.0 <= d <= agent_module.QUICK_RECONNECT_MAX_S for d in delays)


def test_a_single_portal_is_retried_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent import agent as agent_module
    from nodeagent.agent import Agent

    agent = Agent(_config(tmp_path, "ws://127.0.0.1:1"))
    tried: list[str] = []

    async def session() -> None:
        tried.append(agent.portal_url)
        if len(tried) == 2:
            agent.stopping.set()
        raise OSError("connection refused")

    monkeypatch.setattr(agent_module, "reconnect_delay_s", lambda *args: 0.0)
    monkeypatch.setattr(agent, "_session", session)
    asyncio.run(agent.run())
    assert tried == ["ws://127.0.0.1:1/ws/agent/"] * 2
