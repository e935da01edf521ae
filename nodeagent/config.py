"""Agent configuration: command line, JSON file and environment, validated with clear errors (design §1)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
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
    portal: str  # ws(s):// URL of the agent endpoint, e.g. ws://127.0.0.1:8000/ws/agent/ (the first of portals)
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
    trunk_iface: str | None = None  # a building uplink this node has an interface on (design §4 class bytes)
    enforcement: str = "auto"  # auto | off | a backend name (bpf_htb, bpf_tokenbucket, htb_u32, noop)
    link_capacity_bytes_per_s: float | None = None  # access-link capacity B (None: the NIC's speed, else 1 Gbit/s)
    kill_jobs_on_agent_exit: bool = True
    max_message_bytes: int = 64 * 1024
    fence_fraction: float = 0.7  # jobs pause after this fraction of the portal's heartbeat timeout unheard
    # Confined jobs (design §19, nodeagent/confine.py): cgroup backend, parent cgroup, users, default limits.
    confinement: str = "auto"  # auto | off | cgroup_v1 | cgroup_v2
    # under each hierarchy's root (None: <unit cgroup>/jobs under systemd's Delegate=yes, else
    # reclaimnet/agent-<hash of data_dir>; design §19.6)
    cgroup_parent: str | None = None
    job_user: str | None = None  # None: nobody if it can reach data_dir, else the agent's user; "": the agent's
    job_uid_base: int | None = None  # one uid per running job: base .. base+job_uid_count-1 (no passwd entries)
    job_uid_count: int = 256
    memory_bytes_per_gpu: int | None = None  # a job's memory limit per GPU when its start names none
    cpu_cores_per_gpu: float | None = None  # a job's CPU quota (cores) per GPU when its start names none
    job_pids_max: int | None = 4096  # processes and threads per job
    # Jobs not confined (no cgroup, or run as the agent's own user): the agent refuses to start unless this is
    # true (design §19.6); then it warns in its log and the node page says so.
    allow_unconfined_jobs: bool = False
    # Every portal address, in the order the connect loop tries them (design §18: several daphne processes);
    # set from ``portal`` (one URL or a list), never a key of its own. Empty: just ``portal``.
    portals: tuple[str, ...] = ()

    @property
    def portal_urls(self) -> tuple[str, ...]:
        """The portal addresses to try in turn (at least ``portal``)."""
        return self.portals or (self.portal,)


CONFINEMENT_MODES = ("auto", "off", "cgroup_v1", "cgroup_v2")
ENFORCEMENT_MODES = ("auto", "off", "bpf_htb", "bpf_tokenbucket", "htb_u32", "noop")
_SIM_FIELDS = {f.name for f in fields(SimulatedGpu)}
# Keys a config file may hold besides AgentConfig's fields.
EXTRA_KEYS = ("token_file",)
DERIVED_KEYS = ("portals",)  # fields filled from another key (``portal``), not accepted on their own
TOKEN_FILE_ENV = "RECLAIMNET_AGENT_TOKEN_FILE"  # set by the systemd unit's EnvironmentFile (design §18)
_IFACE_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux IFNAMSIZ-1, no '/' or whitespace

log = logging.getLogger(__name__)


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
        model = item.get("model", "SimGPU-24G")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"simulate_gpus[{i}].model: must be a non-empty string")
        vram_gb = _number(f"simulate_gpus[{i}].vram_gb", item.get("vram_gb", 24.0), low=0, high=4096)
        capability = _number(f"simulate_gpus[{i}].capability", item.get("capability", 8.6), low=0, high=100)
        out.append(SimulatedGpu(model=model, vram_gb=vram_gb, capability=capability))
    return tuple(out)


def normalise_portal_url(url: str) -> str:
    """Accept ws(s)://host[:port][/path] (http(s):// is read as ws(s)://); return the agent endpoint's URL.

    Refused, naming ``portal``: any other scheme, no host, a bad port, credentials, a query or a fragment (the
    token travels in a header, never in the URL)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise ConfigError(f"portal: expected a ws:// or wss:// URL with a host, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not 0..65535
    except ValueError as exc:
        raise ConfigError(f"portal: bad port in {url!r}: {exc}") from exc
    if parts.username is not None or parts.password is not None:
        raise ConfigError("portal: must not carry credentials (the token goes in token_file)")
    if parts.query or parts.fragment:
        raise ConfigError(f"portal: must not have a query or fragment, got {url!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws/agent/"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


MAX_PORTAL_URLS = 16


def parse_portal_urls(value: Any) -> tuple[str, ...]:
    """``portal``: one URL or a list of URLs (design §18: agents list every daphne of a portal of several
    processes), each normalised by :func:`normalise_portal_url`; a mistake in a list names ``portal[i]``.
    Duplicates (after normalising) are dropped, the first order kept."""
    if isinstance(value, str):
        return (normalise_portal_url(_string("portal", value)),)
    if not isinstance(value, list | tuple):
        raise ConfigError(f"portal: must be a URL or a list of URLs, got {type(value).__name__} {value!r}")
    if not value:
        raise ConfigError("portal: the list is empty (give at least one URL)")
    if len(value) > MAX_PORTAL_URLS:
        raise ConfigError(f"portal: at most {MAX_PORTAL_URLS} URLs, got {len(value)}")
    out: list[str] = []
    for i, item in enumerate(value):
        key = f"portal[{i}]"
        try:
            url = normalise_portal_url(_string(key, item))
        except ConfigError as exc:
            message = str(exc)
            raise ConfigError(key + message.removeprefix("portal") if message.startswith("portal:")
                              else message) from exc
        if url not in out:
            out.append(url)
    return tuple(out)


def _number(key: str, value: Any, *, low: float, high: float, low_open: bool = True,
            high_open: bool = False) -> float:
    """A JSON number (not a string, not a boolean), finite, in the range; the error names ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if not math.isfinite(number) or too_low or too_high:  # NaN and inf would stall the loops
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ConfigError(f"{key}: must be a finite number in {lo}{low:g}, {high:g}{hi}, got {value!r}")
    return number


def _integer(key: str, value: Any, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{key}: must be {low}..{high}, got {value}")
    return value


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: must be a non-empty string, got {value!r}")
    return value


def _path(key: str, value: Any) -> Path:
    return Path(_string(key, value)).expanduser()


def read_token_file(path: Path, *, strict: bool, key: str = "token_file") -> str:
    """The token in ``path`` (stripped). Readable by anyone but its owner (mode beyond 0600): refused when
    ``strict`` (the agent's command line), else logged as a warning (design §18)."""
    try:
        mode = path.stat().st_mode & 0o777
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {str(path)!r}: {exc}") from exc
    if mode & 0o077:
        message = (f"{key}: {str(path)!r} is mode {mode:04o}, readable by others than its owner; "
                   f"it must be 0600 (chmod 600 {path})")
        if strict:
            raise ConfigError(message)
        log.warning("%s", message)
    if not token:
        raise ConfigError(f"{key}: {str(path)!r} is empty")
    return token


def _token(value: Any, key: str = "token") -> str:
    if not isinstance(value, str) or not value or any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{key}: must be a non-empty string without whitespace")
    return value


def build_config(file_values: dict[str, Any], overrides: dict[str, Any], *,
                 strict_token_file: bool = False) -> AgentConfig:
    """Merge a config file's values with command-line overrides (non-None win) and validate every field.

    Each mistake raises :class:`ConfigError` whose message starts with the field's name: an unknown key, a
    missing ``portal``/``token``, a wrong type (strings are not numbers, numbers not booleans), a value out
    of range, a URL that is not ws(s)://, a token file others can read (refused with ``strict_token_file``,
    which the command line sets; else a warning). Design §1, §18."""
    values = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    known = ({f.name for f in fields(AgentConfig)} - set(DERIVED_KEYS)) | set(EXTRA_KEYS)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")

    token = values.pop("token", None)
    token_file = values.pop("token_file", None)
    if token is not None:
        token = _token(token)
    elif os.environ.get("RECLAIMNET_AGENT_TOKEN"):
        token = _token(os.environ["RECLAIMNET_AGENT_TOKEN"], "RECLAIMNET_AGENT_TOKEN")
    else:
        source = "token_file"
        if token_file is None and os.environ.get(TOKEN_FILE_ENV):
            token_file, source = os.environ[TOKEN_FILE_ENV], TOKEN_FILE_ENV
        if token_file is not None:
            token = _token(read_token_file(_path(source, token_file), strict=strict_token_file, key=source), source)
    if not token:
        raise ConfigError("token: required (--token, token/token_file in the config, RECLAIMNET_AGENT_TOKEN "
                          f"or {TOKEN_FILE_ENV})")
    portal = values.pop("portal", None)
    if portal is None:
        raise ConfigError("portal: required (--portal URL or portal in the config)")
    portals = parse_portal_urls(portal)
    kwargs: dict[str, Any] = {"portal": portals[0], "portals": portals, "token": token}

    for key in ("data_dir", "base_dir"):
        if key in values:
            kwargs[key] = _path(key, values.pop(key))
    kwargs["simulate_gpus"] = _parse_gpus(values.pop("simulate_gpus", None))
    for key, high in (("heartbeat_interval_s", 300.0), ("reconnect_min_s", 60.0), ("reconnect_max_s", 3600.0)):
        if key in values:
            kwargs[key] = _number(key, values.pop(key), low=0.0, high=high)
    if kwargs.get("reconnect_min_s", 0.2) > kwargs.get("reconnect_max_s", 10.0):
        raise ConfigError("reconnect_min_s: must not exceed reconnect_max_s")
    if "data_port" in values:
        kwargs["data_port"] = _integer("data_port", values.pop("data_port"), low=0, high=65535)
    if "max_message_bytes" in values:
        kwargs["max_message_bytes"] = _integer("max_message_bytes", values.pop("max_message_bytes"),
                                               low=1024, high=16 * 1024 * 1024)
    if "data_host" in values:
        kwargs["data_host"] = _string("data_host", values.pop("data_host"))
    if values.get("advertise_host") is not None:
        kwargs["advertise_host"] = _string("advertise_host", values.pop("advertise_host"))
    if values.get("iface") is not None:
        iface = _string("iface", values.pop("iface"))
        if not _IFACE_NAME.match(iface):
            raise ConfigError(f"iface: {iface!r} is not an interface name (1-15 letters, digits, _.:@-)")
        kwargs["iface"] = iface
    if values.get("trunk_iface") is not None:  # design §4 "Calibrated reserve": the trunk's class bytes
        trunk = _string("trunk_iface", values.pop("trunk_iface"))
        if not _IFACE_NAME.match(trunk):
            raise ConfigError(f"trunk_iface: {trunk!r} is not an interface name (1-15 letters, digits, _.:@-)")
        kwargs["trunk_iface"] = trunk
    values.pop("trunk_iface", None)  # an explicit null: none
    if "enforcement" in values:
        if values["enforcement"] not in ENFORCEMENT_MODES:
            raise ConfigError(f"enforcement: must be one of {', '.join(ENFORCEMENT_MODES)}, "
                              f"got {values['enforcement']!r}")
        kwargs["enforcement"] = values.pop("enforcement")
    if values.get("link_capacity_bytes_per_s") is not None:
        kwargs["link_capacity_bytes_per_s"] = _number(
            "link_capacity_bytes_per_s", values.pop("link_capacity_bytes_per_s"), low=0.0, high=1e13)
    if "kill_jobs_on_agent_exit" in values:
        if not isinstance(values["kill_jobs_on_agent_exit"], bool):
            raise ConfigError("kill_jobs_on_agent_exit: must be true or false")
        kwargs["kill_jobs_on_agent_exit"] = values.pop("kill_jobs_on_agent_exit")
    if "fence_fraction" in values:  # at or past the timeout the portal may give jobs away first
        kwargs["fence_fraction"] = _number("fence_fraction", values.pop("fence_fraction"), low=0.0, high=1.0,
                                           high_open=True)
    _confinement(values, kwargs)
    for key in ("advertise_host", "iface", "link_capacity_bytes_per_s"):
        values.pop(key, None)  # an explicit null: the default
    assert not values, f"unvalidated configuration keys: {sorted(values)}"  # every field has a rule above
    return AgentConfig(**kwargs)


_CGROUP_PART = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def _confinement(values: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """The confinement fields (design §19); each error names its field. Pops what it validated."""
    import pwd  # POSIX only, like the agent

    if "allow_unconfined_jobs" in values:
        if not isinstance(values["allow_unconfined_jobs"], bool):
            raise ConfigError("allow_unconfined_jobs: must be true or false")
        kwargs["allow_unconfined_jobs"] = values.pop("allow_unconfined_jobs")
    if "confinement" in values:
        if values["confinement"] not in CONFINEMENT_MODES:
            raise ConfigError(f"confinement: must be one of {', '.join(CONFINEMENT_MODES)}, "
                              f"got {values['confinement']!r}")
        kwargs["confinement"] = values.pop("confinement")
    if values.get("cgroup_parent") is not None:
        parent = _string("cgroup_parent", values.pop("cgroup_parent")).strip("/")
        parts = parent.split("/")
        if len(parts) > 8 or not all(_CGROUP_PART.match(p) and p not in (".", "..") for p in parts):
            raise ConfigError(f"cgroup_parent: {parent!r} must be 1-8 path components of letters, digits, _.@-")
        kwargs["cgroup_parent"] = parent
    if values.get("job_user") is not None:
        user = values.pop("job_user")
        if not isinstance(user, str):
            raise ConfigError(f"job_user: must be a user name (\"\" for the agent's own user), got {user!r}")
        if user:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise ConfigError(f"job_user: no such user {user!r} on this host") from None
        kwargs["job_user"] = user
    if "job_uid_count" in values:
        kwargs["job_uid_count"] = _integer("job_uid_count", values.pop("job_uid_count"), low=1, high=65536)
    if values.get("job_uid_base") is not None:
        count = kwargs.get("job_uid_count", 256)
        base = _integer("job_uid_base", values.pop("job_uid_base"), low=1000, high=2**31 - 2 - count)
        taken = sorted(p.pw_name for p in pwd.getpwall() if base <= p.pw_uid < base + count)
        if taken:
            raise ConfigError(f"job_uid_base: uids {base}..{base + count - 1} include existing users: "
                              f"{', '.join(taken[:5])}")
        kwargs["job_uid_base"] = base
    if values.get("memory_bytes_per_gpu") is not None:
        kwargs["memory_bytes_per_gpu"] = _integer("memory_bytes_per_gpu", values.pop("memory_bytes_per_gpu"),
                                                  low=16 * 1024 * 1024, high=2**50)
    if values.get("cpu_cores_per_gpu") is not None:
        kwargs["cpu_cores_per_gpu"] = _number("cpu_cores_per_gpu", values.pop("cpu_cores_per_gpu"), low=0.0,
                                              high=1024.0)
    if values.get("job_pids_max") is not None:
        kwargs["job_pids_max"] = _integer("job_pids_max", values.pop("job_pids_max"), low=16, high=4_194_304)
    for key in ("cgroup_parent", "job_user", "job_uid_base", "memory_bytes_per_gpu", "cpu_cores_per_gpu",
                "job_pids_max"):
        if key in values and values[key] is None:
            values.pop(key)
            if key == "job_pids_max":
                kwargs[key] = None  # null: no process limit


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
