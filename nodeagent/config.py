"""Agent configuration: command line, JSON file and environment, validated with clear errors (design §1)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field."""


@dataclass(frozen=True)
class SimulatedGpu:
    model: str = "SimGPU-24G"
    vram_gb: float = 24.0
    capability: float = 8.6


@dataclass(frozen=True)
class AgentConfig:
    portal: str  # ws(s):// URL of the agent endpoint, e.g. ws://127.0.0.1:8000/ws/agent/
    token: str
    data_dir: Path = Path("agent-data")
    data_host: str = "127.0.0.1"  # where the checkpoint server listens
    data_port: int = 0  # 0: any free port (reported to the portal in hello)
    advertise_host: str | None = None  # address other agents use to reach the data server
    simulate_gpus: tuple[SimulatedGpu, ...] = ()  # used only when NVML finds no GPU
    heartbeat_interval_s: float = 2.0  # the portal's welcome overrides it
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    base_dir: Path = field(default_factory=Path.cwd)  # relative script paths in job commands resolve here
    iface: str | None = None  # egress interface for counters/enforcement (None: every non-loopback one)
    enforcement: str = "auto"  # auto | off | a backend name (bpf_htb, bpf_tokenbucket, htb_u32, noop)
    link_capacity_bytes_per_s: float | None = None  # access-link capacity B (None: the NIC's speed, else 1 Gbit/s)
    kill_jobs_on_agent_exit: bool = True
    max_message_bytes: int = 64 * 1024
    fence_fraction: float = 0.7  # jobs pause after this fraction of the portal's heartbeat timeout unheard


ENFORCEMENT_MODES = ("auto", "off", "bpf_htb", "bpf_tokenbucket", "htb_u32", "noop")
_SIM_FIELDS = {f.name for f in fields(SimulatedGpu)}


def _parse_gpus(value: Any) -> tuple[SimulatedGpu, ...]:
    """``simulate_gpus``: an integer count (default model) or a list of ``{model, vram_gb, capability}``."""
    if value is None:
        return ()
    if isinstance(value, bool):
        raise ConfigError("simulate_gpus: expected a count or a list of GPUs, got a boolean")
    if isinstance(value, int):
        if not 0 <= value <= 64:
            raise ConfigError(f"simulate_gpus: count must be 0..64, got {value}")
        return tuple(SimulatedGpu() for _ in range(value))
    if not isinstance(value, list):
        raise ConfigError("simulate_gpus: expected a count or a list of GPUs")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not set(item) <= _SIM_FIELDS:
            raise ConfigError(f"simulate_gpus[{i}]: expected an object with keys {sorted(_SIM_FIELDS)}")
        try:
            gpu = SimulatedGpu(
                model=str(item.get("model", "SimGPU-24G")),
                vram_gb=float(item.get("vram_gb", 24.0)),
                capability=float(item.get("capability", 8.6)),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"simulate_gpus[{i}]: {exc}") from exc
        if gpu.vram_gb <= 0 or gpu.capability <= 0:
            raise ConfigError(f"simulate_gpus[{i}]: vram_gb and capability must be > 0")
        out.append(gpu)
    return tuple(out)


def normalise_portal_url(url: str) -> str:
    """Accept http(s)://host:port[/ws/agent/] and ws(s)://…; return the websocket URL of the agent endpoint."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ConfigError(f"portal: expected ws://, wss://, http:// or https:// URL, got {url!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws/agent/"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> AgentConfig:
    """Merge a config file's values with command-line overrides (non-None win) and validate."""
    values = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    known = {f.name for f in fields(AgentConfig)} | {"token_file"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
    token = values.pop("token", None) or os.environ.get("RECLAIMNET_AGENT_TOKEN")
    token_file = values.pop("token_file", None)
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"token_file: cannot read {token_file!r}: {exc}") from exc
    if not token or not isinstance(token, str):
        raise ConfigError("token: required (--token, token/token_file in the config, or RECLAIMNET_AGENT_TOKEN)")
    portal = values.pop("portal", None)
    if not portal or not isinstance(portal, str):
        raise ConfigError("portal: required (--portal URL or portal in the config)")
    kwargs: dict[str, Any] = {"portal": normalise_portal_url(portal), "token": token}
    try:
        for key in ("data_dir", "base_dir"):
            if key in values:
                kwargs[key] = Path(values.pop(key)).expanduser()
        kwargs["simulate_gpus"] = _parse_gpus(values.pop("simulate_gpus", None))
        for key in ("heartbeat_interval_s", "reconnect_min_s", "reconnect_max_s"):
            if key in values:
                kwargs[key] = float(values.pop(key))
                if not (kwargs[key] > 0 and math.isfinite(kwargs[key])):  # NaN and inf would stall the loops
                    raise ConfigError(f"{key}: must be a finite number > 0")
        if kwargs.get("reconnect_min_s", 0.2) > kwargs.get("reconnect_max_s", 10.0):
            raise ConfigError("reconnect_min_s: must not exceed reconnect_max_s")
        for key in ("data_port", "max_message_bytes"):
            if key in values:
                if isinstance(values[key], bool | float):
                    raise ConfigError(f"{key}: must be an integer")
                kwargs[key] = int(values.pop(key))
        if not 0 <= kwargs.get("data_port", 0) <= 65535:
            raise ConfigError("data_port: must be 0..65535")
        if not 1024 <= kwargs.get("max_message_bytes", 64 * 1024) <= 16 * 1024 * 1024:
            raise ConfigError("max_message_bytes: must be 1024..16777216")
        for key in ("data_host", "advertise_host", "iface"):
            if key in values and not (values[key] is None and key != "data_host") and not (
                isinstance(values[key], str) and values[key]
            ):
                raise ConfigError(f"{key}: must be a non-empty string")
        if "enforcement" in values and values["enforcement"] not in ENFORCEMENT_MODES:
            raise ConfigError(f"enforcement: must be one of {', '.join(ENFORCEMENT_MODES)}")
        if "link_capacity_bytes_per_s" in values:
            kwargs["link_capacity_bytes_per_s"] = float(values.pop("link_capacity_bytes_per_s"))
            if not (kwargs["link_capacity_bytes_per_s"] > 0 and math.isfinite(kwargs["link_capacity_bytes_per_s"])):
                raise ConfigError("link_capacity_bytes_per_s: must be > 0")
        if "kill_jobs_on_agent_exit" in values and not isinstance(values["kill_jobs_on_agent_exit"], bool):
            raise ConfigError("kill_jobs_on_agent_exit: must be true or false")
        if "fence_fraction" in values:
            kwargs["fence_fraction"] = float(values.pop("fence_fraction"))
            if not 0 < kwargs["fence_fraction"] < 1:  # at or past the timeout the portal may give jobs away first
                raise ConfigError("fence_fraction: must be in (0, 1)")
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid value: {exc}") from exc
    kwargs.update(values)
    return AgentConfig(**kwargs)


def load_config_file(path: str) -> dict[str, Any]:
    """Read a JSON config file (an object)."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path!r}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"config file {path!r} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path!r}: expected a JSON object")
    return raw
