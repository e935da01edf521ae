"""Where the command line keeps the portal's address and the user's API token (design §13).

``$XDG_CONFIG_HOME/reclaimnet/config.json`` (``~/.config/reclaimnet/config.json`` when the variable is unset or
not absolute, as the XDG base directory specification says). The token is a password: the file is created with
mode 0600 from its first byte (a new file opened ``O_CREAT | O_EXCL`` with that mode, then renamed over the old
one), in a directory made 0700, so it is never readable by others, not even for a moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

FILE_MODE = 0o600
DIR_MODE = 0o700


def config_path() -> Path:
    """The config file's path (it may not exist yet)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "reclaimnet" / "config.json"


def load() -> dict[str, Any]:
    """The stored settings (``url``, ``username``, ``token``); {} when there are none or the file is unreadable
    as JSON."""
    try:
        data = json.loads(config_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(settings: dict[str, Any]) -> Path:
    """Write ``settings`` atomically with mode 0600; returns the path written."""
    path = config_path()
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(settings, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, FILE_MODE)  # whatever the umask: never more than 0600
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def forget_token() -> bool:
    """Remove the stored token (keeping the address); True when there was one."""
    settings = load()
    if "token" not in settings:
        return False
    settings.pop("token")
    save(settings)
    return True
