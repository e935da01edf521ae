"""The control plane's tunables (``settings.RECLAIMNET``: α, k_min, β, the minimum checkpoint interval Δ_min, the
research reserve, timeouts)."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def rn(key: str) -> Any:
    return settings.RECLAIMNET[key]
