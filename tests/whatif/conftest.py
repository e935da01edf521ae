"""Fixtures of the what-if tests: a small campus history seeded with the portal's factories (design §7)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone

from portal.core.models import BandwidthSample, Job, Node, NodeAvailability, ReclaimEvent
from tests.portal import factories as f

DAY = dt.timedelta(days=1)


@dataclass
class History:
    since: dt.datetime
    until: dt.datetime
    nodes: list[Node]
    jobs: list[Job]
    reclaims: list[ReclaimEvent]
    samples: int
    admin: Any
    researcher: Any


def _at(model: Any, pk: int, **times: dt.datetime) -> None:
    model.objects.filter(pk=pk).update(**times)


@pytest.fixture
def history(db: Any) -> History:
    """Two buildings, three nodes (one keeps all its GPUs: left out), four jobs, three reclaims (one returns),
    bandwidth samples in three 10-minute buckets, over the 2 days before ``until``."""
    until = timezone.now().replace(microsecond=0)
    since = until - 2 * DAY
    admin = f.make_user("wi-admin", staff=True, password=f.PASSWORD)
    researcher = f.make_user("wi-researcher", password=f.PASSWORD)
    lab = f.make_provider("WI Lab", (admin,))
    group = f.make_group("WI Group", (researcher,))
    b1, b2 = f.make_building("WI East"), f.make_building("WI West")
    n1, _ = f.make_node(lab, b1, name="wi-east-01", gpus=2, state="online")
    n2, _ = f.make_node(lab, b2, name="wi-west-01", gpus=1, state="online")
    n3, _ = f.make_node(lab, b2, name="wi-west-02", gpus=1, state="online", gpu_floor=1)  # lends nothing
    for node in (n1, n2, n3):
        _at(Node, node.pk, created_at=since - DAY)
    jobs = []
    for k, (gpus, budget) in enumerate([(1, 600.0), (2, None), (1, 1200.0), (1, 300.0)]):
        job = f.make_job(group, researcher, gpu_count=gpus, loss_budget_s=budget, expected_runtime_s=7200.0 + k,
                         ckpt_bytes_estimate=2_000_000_000 + k, restart_s=20.0 + k, vram_gb_per_gpu=8.0)
        _at(Job, job.pk, submitted_at=since + dt.timedelta(hours=1 + 3 * k))
        jobs.append(job)
    old = f.make_job(group, researcher)  # before the window: not exported
    _at(Job, old.pk, submitted_at=since - DAY)
    reclaims = []
    for node, kind, at_h, notice_s in [(n1, "scheduled", 5, 300.0), (n2, "emergency", 8, 0.0), (n1, "emergency", 30, 0.0)]:
        when = since + dt.timedelta(hours=at_h)
        r = ReclaimEvent.objects.create(node=node, kind=kind, notice_s=notice_s,
                                        deadline_at=when + dt.timedelta(seconds=notice_s))
        _at(ReclaimEvent, r.pk, requested_at=when)
        reclaims.append(r)
    NodeAvailability.objects.create(node=n1, at=since + dt.timedelta(hours=7), state="online", lent=True)
    samples = []
    for link in (n1.access_link, n2.access_link):
        for bucket in range(3):
            for k in range(2):  # two samples per 10-minute bucket: the export averages them
                samples.append(BandwidthSample(link=link, node=None, bytes_per_s=1e7 * (bucket + 1) + k * 1e6,
                                               sampled_at=since + dt.timedelta(minutes=10 * bucket + 2 + 3 * k)))
    BandwidthSample.objects.bulk_create(samples)
    for r in reclaims:
        r.refresh_from_db()
    return History(since, until, [n1, n2, n3], jobs, reclaims, len(samples), admin, researcher)
