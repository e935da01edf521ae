"""Suite-wide fixtures and the report header that says which database the suite runs against."""

from __future__ import annotations

import os

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get("DATABASE_URL", "")
    engine = "PostgreSQL" if url.startswith(("postgres://", "postgresql://")) else "SQLite (embedded default)"
    redis = os.environ.get("REDIS_URL") or "none (in-memory channel layer, eager Celery)"
    return [f"reclaimnet: database {engine} ({url or 'sqlite file'}), redis {redis}"]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: object) -> None:
    """PBKDF2 at its production work factor costs ~0.3 s per password: tests use MD5 (never in production)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # type: ignore[attr-defined]
