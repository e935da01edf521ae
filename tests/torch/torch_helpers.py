"""Shared by the PyTorch / Hugging Face job tests (design §17): the optional-dependency gate, tensor comparison."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
OPTIONAL_ENV = "RECLAIMNET_TORCH_OPTIONAL"  # "1": skip these tests when torch/transformers are missing


def require(module: str) -> ModuleType:
    """Import ``module``; when it is missing, skip the calling test module only if RECLAIMNET_TORCH_OPTIONAL=1
    (``make test`` installs torch and transformers, so by default a missing one is an error)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get(OPTIONAL_ENV) == "1":
            pytest.skip(f"{module} is not installed and {OPTIONAL_ENV}=1 makes it optional", allow_module_level=True)
        raise ImportError(f"{module} is not installed: run scripts/install_torch_deps.sh (or set "
                          f"{OPTIONAL_ENV}=1 to skip the PyTorch job tests)") from exc


def assert_state_dicts_bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert sorted(a) == sorted(b)
    different = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                      and torch.equal(a[k], b[k]))]
    assert not different, f"tensors differ after resume: {different[:10]}"
