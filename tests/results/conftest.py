"""Fixtures for the job results tests (design §14): results kept in a temporary directory, a campus with a job
placed on a node whose agent token the tests hold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.portal import factories as f


@pytest.fixture(autouse=True)
def results_dirs(settings: Any, tmp_path: Path) -> Path:
    """The ``results`` storage and its staging directory under this test's temporary directory."""
    root = tmp_path / "media"
    settings.STORAGES = {**settings.STORAGES, "results": {
        "BACKEND": "portal.core.results_storage.AtomicFileSystemStorage",
        "OPTIONS": {"location": str(root / "results")}}}
    settings.RECLAIMNET_RESULTS_STAGING_DIR = root / "results-staging"
    settings.RECLAIMNET_RESULTS_GROUP_CAP_BYTES = 10 * 2**20
    return root


@dataclass
class Campus:
    users: dict[str, Any]
    group: Any
    other_group: Any
    node: Any
    token: str
    other_node: Any
    other_token: str
    job: Any


@pytest.fixture
def campus(db: Any) -> Campus:
    """``job`` (owned by "researcher", of NLP Group) runs on ``node``; "other_researcher" is in Bio Group."""
    t = f.make_two_labs()
    other_node, other_token = f.make_node(t.other_lab, t.building, name="robotics-02", state="online")
    job = f.make_job(t.group, t.users["researcher"], name="results-job", output_dir="out")
    f.place_job(job, t.node)
    return Campus(t.users, t.group, t.other_group, t.node, t.node_token, other_node, other_token, job)
