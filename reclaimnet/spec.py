"""Job specs: a YAML or JSON file with the fields of ``POST /api/jobs/`` (design §13).

The portal validates every field, exactly as it validates the web form, and its errors name the field; this
module only reads the file. It passes every field through (new API fields need no change here) and adds two
conveniences: a value of a ``…_s`` field may be a duration (``"90m"``, ``"4h"``, ``"1h30m"``, ``"2d"``) and a
value of a ``…bytes…`` field a size (``"3.2GB"``, ``"500 MiB"``; ``memory_bytes`` also ``"16G"``, binary). A
string that is neither stays as written, so the portal's answer names the field.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any


class SpecError(Exception):
    """The spec file cannot be read or is not a mapping of fields (the command line exits 2)."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|min|s)", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:d|h|m|min|s)\s*)+$", re.IGNORECASE)
_DURATION_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b)\s*$", re.IGNORECASE)
_SIZE_PREFIX = {"": 1, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_duration_s(text: str) -> float | None:
    """``"1h30m"`` → 5400.0; None when ``text`` is not a duration."""
    if not _DURATION.match(text):
        return None
    return sum(float(number) * _DURATION_UNIT_S[unit.lower()] for number, unit in _DURATION_PART.findall(text))


def parse_size_bytes(text: str) -> int | None:
    """``"3.2GB"`` → 3_200_000_000, ``"1 GiB"`` → 1_073_741_824; None when ``text`` is not a size."""
    match = _SIZE.match(text)
    if match is None:
        return None
    number, unit = float(match.group(1)), match.group(2).lower()
    base = 1024 if "i" in unit else 1000
    return round(number * base ** _SIZE_PREFIX[unit[0] if unit[0] in "kmgtp" else ""])


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt])\s*$", re.IGNORECASE)


def parse_memory_bytes(text: str) -> int | None:
    """A memory limit as Slurm's ``--mem`` and Docker's ``--memory`` write it, binary: ``"16G"`` → 16 GiB,
    ``"512M"`` → 512 MiB (K, M, G, T); or any size :func:`parse_size_bytes` reads (``"16GiB"``, ``"16GB"``).
    None when ``text`` is neither (a bare number has no unit: None too)."""
    match = _MEMORY.match(text)
    if match is not None:
        return round(float(match.group(1)) * 1024 ** _SIZE_PREFIX[match.group(2).lower()])
    return parse_size_bytes(text)


def _convert(name: str, value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()  # YAML reads bare dates as dates; the API takes ISO 8601 text
    if isinstance(value, dict):
        return {str(key): _convert(str(key), item) for key, item in value.items()}
    if isinstance(value, list):
        return [_convert(name, item) for item in value]
    if isinstance(value, str):
        if name.endswith("_s"):
            seconds = parse_duration_s(value)
            if seconds is not None:
                return seconds
        if "bytes" in name:
            size = parse_memory_bytes(value) if name == "memory_bytes" else parse_size_bytes(value)
            if size is not None:
                return size
    return value


def parse_spec(text: str, source: str = "spec") -> dict[str, Any]:
    """The fields of a spec's text (YAML, of which JSON is a part)."""
    import yaml  # here, not at the top: a fifth of the start-up time of every other command

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise SpecError(f"{source}: not valid YAML or JSON{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a spec is a mapping of job fields (name: …, gpu_count: …), "
                        f"not {type(data).__name__ if data is not None else 'an empty file'}.")
    bad = [key for key in data if not isinstance(key, str)]
    if bad:
        raise SpecError(f"{source}: field names are text, not {bad[0]!r}.")
    return {key: _convert(key, value) for key, value in data.items()}


def load_spec(path: str) -> dict[str, Any]:
    """Read a spec file (``-`` for standard input)."""
    if path == "-":
        return parse_spec(sys.stdin.read(), "<stdin>")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot read it: {getattr(error, 'strerror', None) or error}.") from None
    if path.endswith(".json"):
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}.") \
                from None
    return parse_spec(text, path)
