"""Per-user quotas are per (group, user) (design §16.6): a member's limit in one group never throttles, nor counts
usage from, that member's jobs in another group."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from portal.core.models import Placement
from portal.queue.models import FairShareConfig, OverQuotaRun, UserQuota
from portal.queue.standing import group_standing
from tests.portal import factories as f
from tests.queue.conftest import QueueCampus, open_placements


def test_a_members_limit_in_one_group_does_not_hold_back_their_jobs_in_another(qc: QueueCampus, place: Any) -> None:
    node = qc.node(2)
    qc.b.members.add(qc.alice)
    UserQuota.objects.create(group=qc.a, user=qc.alice, max_gpus=1)
    in_a = f.make_job(qc.a, qc.alice, gpu_count=1)
    f.place_job(in_a, node, [0])  # alice holds her one GPU of group A
    in_b = f.make_job(qc.b, qc.alice, gpu_count=1)
    other_b = f.make_job(qc.b, qc.bob, gpu_count=1)  # an in-quota job waits too: over-quota ones would yield to it
    place()
    assert open_placements([in_b, other_b]) == {in_b.pk}  # same group and priority: the older one, within quota
    assert not OverQuotaRun.objects.filter(job=in_b).exists()


def test_a_members_usage_counts_only_against_their_limit_in_the_group_that_used_it(qc: QueueCampus) -> None:
    node = qc.node(1)
    qc.b.members.add(qc.alice)
    UserQuota.objects.create(group=qc.a, user=qc.alice, max_gpu_hours_30d=5)
    used_in_b = f.make_job(qc.b, qc.alice, gpu_count=1, state="completed")
    now = timezone.now()
    p = Placement.objects.create(job=used_in_b, node=node, gpu_indices=[0])
    Placement.objects.filter(pk=p.pk).update(started_at=now - dt.timedelta(hours=12), ended_at=now - dt.timedelta(
        hours=2), end_reason="completed")
    standing = group_standing(now, FairShareConfig.current(), {(qc.b.pk, qc.alice.pk)})
    in_a = standing.user_index[(qc.a.pk, qc.alice.pk)]
    in_b = standing.user_index[(qc.b.pk, qc.alice.pk)]
    assert standing.user_used_30d_gpu_s[in_a] == 0.0
    assert abs(standing.user_used_30d_gpu_s[in_b] - 10 * 3600.0) < 1.0
    assert standing.user_max_gpu_s_30d[in_a] == 5 * 3600.0
    assert standing.user_max_gpu_s_30d[in_b] == float("inf")
