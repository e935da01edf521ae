"""Typed environment helpers for settings (healthchecks-style): bad values fail loudly.

Every helper also accepts ``NAME_FILE`` pointing at a file that holds the value, for secrets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str | None = None) -> str | None:
    """The value of ``name`` (or the contents of the file named by ``name_FILE``), else ``default``."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0/true/false/yes/no), got {raw!r}")


def env_float(name: str, default: float) -> float:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    raw = env_str(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


PROCESS_KINDS = ("daphne", "worker", "beat", "other")


def process_kind(argv: list[str] | None = None) -> str:
    """Which of the production processes this is: ``RECLAIMNET_PROCESS_KIND`` if set, else read from the command
    line (``daphne …``, ``celery … worker`` — with ``-B`` too —, ``celery … beat``), else ``other`` (management
    commands, tests). It names the process's database connections and sizes its connection pool."""
    kind = env_str("RECLAIMNET_PROCESS_KIND")
    if kind:
        if kind not in PROCESS_KINDS:
            raise ImproperlyConfigured(f"RECLAIMNET_PROCESS_KIND must be one of {PROCESS_KINDS}, got {kind!r}")
        return kind
    args = list(sys.argv if argv is None else argv)
    program = Path(args[0]).parent.name if args and Path(args[0]).name == "__main__.py" else Path(
        args[0] if args else "").name
    if program == "daphne":
        return "daphne"
    if program == "celery":
        for arg in args[1:]:
            if arg in ("worker", "beat"):
                return arg
    return "other"
