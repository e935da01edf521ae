"""Suite-wide fixtures and the report header that says which database the suite runs against."""

from __future__ import annotations

import os

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get("DATABASE_URL", "")
    engine = "PostgreSQL" if url.startswith(("postgres://", "postgresql://")) else "SQLite (embedded default)"
    redis = os.environ.get("REDIS_URL") or "none (in-memory channel layer, eager Celery)"
    return [f"reclaimnet: database {engine} ({url or 'sqlite file'}), redis {redis}"]

