"""``class_bytes`` of a heartbeat: bytes per traffic class on the node's access link and on a trunk it sees
(design §4 "Calibrated reserve"). Checked here at the portal's boundary, every field named in the refusal; the
handler stores one :class:`~portal.core.models.LinkClassSample` per node and scope per sampling period
(:mod:`portal.control.link.class_samples`). Pure: no Django, so the protocol module stays free of models.

``class_bytes``: ``{"interval_s": float > 0, "source": str, "access": {"research": int, "checkpoint": int,
"other": int}, "trunk": {...}}`` — deltas since the agent's previous report (``nodeagent/classbytes.py``),
never raw counters, so every number is a non-negative integer and ``interval_s`` says what it covers.
"""

from __future__ import annotations

import math
from typing import Any

CLASSES = ("research", "checkpoint", "other")
SCOPES = ("access", "trunk")
MAX_INTERVAL_S = 3600.0  # an agent reports every few seconds; an hour-long delta is not one report
MAX_BYTES_PER_S = 1e12  # 8 Tbit/s, as for the egress samples: above any NIC is the agent's error
MAX_SOURCE_CHARS = 32


class ClassBytesError(ValueError):
    """``class_bytes`` is malformed; the message names the field."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_class_bytes(kind: str, value: Any) -> None:
    """Refuse a malformed ``class_bytes`` naming the field: finite, ≥ 0, integer byte deltas, a positive
    interval, rates no NIC reaches, only known scopes and classes."""
    where = f"{kind}.class_bytes"
    if not isinstance(value, dict):
        raise ClassBytesError(f"{where}: an object")
    unknown = set(value) - {"interval_s", "source", *SCOPES}
    if unknown:
        raise ClassBytesError(f"{where}.{sorted(unknown)[0]}: not a field (interval_s, source, access, trunk)")
    interval = value.get("interval_s")
    if not _number(interval) or not 0 < interval <= MAX_INTERVAL_S:
        raise ClassBytesError(f"{where}.interval_s: a finite number of seconds in (0, {MAX_INTERVAL_S:.0f}]")
    if "source" in value and (not isinstance(value["source"], str) or len(value["source"]) > MAX_SOURCE_CHARS):
        raise ClassBytesError(f"{where}.source: a string of at most {MAX_SOURCE_CHARS} characters")
    if "access" not in value:
        raise ClassBytesError(f"{where}.access: missing")
    for scope in SCOPES:
        if scope not in value:
            continue
        counts = value[scope]
        if not isinstance(counts, dict):
            raise ClassBytesError(f"{where}.{scope}: an object of byte counts")
        bad = set(counts) - set(CLASSES)
        if bad:
            raise ClassBytesError(f"{where}.{scope}.{sorted(bad)[0]}: not a class (research, checkpoint, other)")
        for name, nbytes in counts.items():
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise ClassBytesError(f"{where}.{scope}.{name}: a non-negative integer number of bytes (a delta)")
        if sum(counts.values()) > MAX_BYTES_PER_S * interval:
            raise ClassBytesError(f"{where}.{scope}: more than {MAX_BYTES_PER_S:.0e} bytes/s over interval_s")
