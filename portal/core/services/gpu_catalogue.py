"""Known GPU models with default VRAM and CUDA compute capability (design §1: a GPU has model, VRAM, capability).

A provider declares a model by name; VRAM and capability default from here and may be overridden (e.g. the
40 GB A100). Unknown models are refused so that capability matching (design §3 feasibility) never guesses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class GpuSpec:
    model: str
    vram_gb: float
    compute_capability: Decimal


def _spec(model: str, vram_gb: float, capability: str) -> GpuSpec:
    return GpuSpec(model, vram_gb, Decimal(capability))


GPU_CATALOGUE: dict[str, GpuSpec] = {
    spec.model: spec
    for spec in (
        _spec("RTX 2080 Ti", 11, "7.5"),
        _spec("RTX 3080", 10, "8.6"),
        _spec("RTX 3090", 24, "8.6"),
        _spec("RTX 3090 Ti", 24, "8.6"),
        _spec("RTX 4080", 16, "8.9"),
        _spec("RTX 4090", 24, "8.9"),
        _spec("RTX 5090", 32, "12.0"),
        _spec("RTX A4000", 16, "8.6"),
        _spec("RTX A5000", 24, "8.6"),
        _spec("RTX A6000", 48, "8.6"),
        _spec("RTX 6000 Ada", 48, "8.9"),
        _spec("T4", 16, "7.5"),
        _spec("V100", 32, "7.0"),
        _spec("A10", 24, "8.6"),
        _spec("A30", 24, "8.0"),
        _spec("A40", 48, "8.6"),
        _spec("A100", 80, "8.0"),
        _spec("A100 40GB", 40, "8.0"),
        _spec("L4", 24, "8.9"),
        _spec("L40", 48, "8.9"),
        _spec("L40S", 48, "8.9"),
        _spec("H100", 80, "9.0"),
        _spec("H200", 141, "9.0"),
        _spec("B200", 180, "10.0"),
    )
}

# Other spellings seen in ``nvidia-smi`` output and in how people write them, after normalisation.
_ALIASES: dict[str, str] = {
    "A6000": "RTX A6000",
    "A100 80GB": "A100",
    "A100 SXM4 80GB": "A100",
    "A100 PCIE 80GB": "A100",
    "A100 SXM4 40GB": "A100 40GB",
    "A100 PCIE 40GB": "A100 40GB",
    "H100 80GB HBM3": "H100",
    "H100 PCIE": "H100",
    "H100 SXM": "H100",
    "V100 SXM2 32GB": "V100",
    "V100 PCIE 32GB": "V100",
    "TESLA T4": "T4",
    "TESLA V100": "V100",
}


def _normalise(name: str) -> str:
    cleaned = re.sub(r"[\s_\-]+", " ", name.strip().upper())
    for prefix in ("NVIDIA ", "GEFORCE "):
        cleaned = cleaned.removeprefix(prefix)
    return cleaned


_INDEX: dict[str, str] = {_normalise(model): model for model in GPU_CATALOGUE}
_INDEX.update({_normalise(alias): model for alias, model in _ALIASES.items()})


def lookup_gpu(model: str) -> GpuSpec | None:
    """The catalogue entry for ``model`` (case, vendor prefix and separators ignored), or None if unknown."""
    if not isinstance(model, str):
        return None
    canonical = _INDEX.get(_normalise(model))
    return GPU_CATALOGUE[canonical] if canonical else None
