"""Scheduler tests: a pure library, no Django. Puts scripts/ on the path for the literal reference."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


@pytest.fixture(autouse=True)
def _fast_password_hashing() -> None:
    """Overrides the suite-wide Django fixture: these tests never touch Django (and run with -p no:django)."""

