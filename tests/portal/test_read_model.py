"""The campus read model (design §9.1) is the one home of hazard, lendable GPUs and link bandwidth."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.test import Client

from portal.core import campus
from portal.core.campus import PRIOR_HAZARD_PER_S, hazard_upper_by_hour, link_available_bytes_per_s
from portal.core.models import HazardEstimate, HazardScope, Node
from portal.web import dashboard
from tests.portal import factories as f
from tests.portal.conftest import World

PORTAL = Path(__file__).resolve().parents[2] / "portal"
# The read model, the estimator (the estimates' one writer) and the models may touch these; nobody else.
ALLOWED = {"core/campus.py", "control/loop/estimates.py"}
COPIES = re.compile(r"HazardEstimate\.objects|[-]\s*(?:\w+\.)?gpu_floor\b|gpu_floor\s*[-]|Sum\(\"gpu_floor\"\)")


def test_hazard_and_floor_arithmetic_live_only_in_the_read_model() -> None:
    offenders = []
    for path in sorted(PORTAL.rglob("*.py")):
        relative = path.relative_to(PORTAL).as_posix()
        if relative in ALLOWED or relative.startswith("core/models/") or "/migrations/" in relative:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if COPIES.search(line):
                offenders.append(f"portal/{relative}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.django_db
def test_hazard_falls_back_node_then_provider_then_campus_then_prior(world: World) -> None:
    node, other = world.node, world.other_node  # different providers
    HazardEstimate.objects.create(scope=HazardScope.CAMPUS, hour_of_day=3, hazard_per_s=1e-4,
                                  hazard_upper_per_s=3e-4)
    HazardEstimate.objects.create(scope=HazardScope.CAMPUS, hour_of_day=4, hazard_per_s=1e-4,
                                  hazard_upper_per_s=3e-4)
    HazardEstimate.objects.create(scope=HazardScope.PROVIDER, provider=world.lab, hour_of_day=4,
                                  hazard_per_s=2e-4, hazard_upper_per_s=5e-4)
    HazardEstimate.objects.create(scope=HazardScope.NODE, node=node, hour_of_day=5, hazard_per_s=0.0,
                                  hazard_upper_per_s=0.0)
    profile = hazard_upper_by_hour([node.pk, other.pk])
    assert profile.shape == (2, 24)
    assert profile[0, 3] == profile[1, 3] == 3e-4  # campus
    assert profile[0, 4] == 5e-4 and profile[1, 4] == 3e-4  # node's provider, the other's falls to the campus
    assert profile[0, 5] == campus.HAZARD_FLOOR_PER_S  # a node's own zero is clamped, not replaced
    assert profile[1, 5] == PRIOR_HAZARD_PER_S  # nothing at all: the prior
    np.testing.assert_array_equal(hazard_upper_by_hour([node.pk, other.pk], hour=4), profile[:, 4])


def test_link_bandwidth_is_the_lower_bound_within_the_capacity() -> None:
    assert link_available_bytes_per_s(125e6, None) == 125e6
    assert link_available_bytes_per_s(125e6, 50e6) == 50e6
    assert link_available_bytes_per_s(125e6, 500e6) == 125e6
    assert link_available_bytes_per_s(125e6, float("nan")) == 125e6
    assert link_available_bytes_per_s(125e6, 1e-3) == 1.0


@pytest.mark.django_db
def test_every_screen_counts_the_same_lendable_gpus(world: World, settings: Any) -> None:
    # vision-01: 2 GPUs, robotics-01: 1 GPU, both online. Add: a lent node with a floor, an offline node and a
    # kill-switched one — only the first counts.
    floored, _ = f.make_node(world.lab, world.building, gpus=4, gpu_floor=1, state="online")
    f.make_node(world.lab, world.building, gpus=4, state="offline")
    switched, _ = f.make_node(world.lab, world.building, gpus=4, state="online")
    Node.objects.filter(pk=switched.pk).update(killswitch_engaged=True)
    expected = 2 + 1 + 3
    assert campus.lendable_gpus_total() == expected
    admin = Client()
    admin.force_login(world.users["admin"])
    assert admin.get("/api/summary/").json()["gpus_lendable_online"] == expected
    assert dashboard.summary()["gpus_lent"] == expected
    settings.METRICS_TOKEN = "scrape"
    metrics = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape").content.decode()
    assert re.search(rf"^reclaimnet_gpus_lendable {expected}\.0$", metrics, re.M)
    assert floored.lendable_gpu_count == 3
