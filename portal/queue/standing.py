"""Reading the queue's state for one pass, in a fixed number of statements (design §16.6).

Usage for fair share is GPU-seconds per group from placements (started, ended), decayed by the half-life, read
in one statement per pass whatever the number of jobs; the 30-day GPU-hours quota is the same rows' part inside
the window.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
from django.db.models import Q

from portal.core.models import Placement, ResearchGroup
from portal.queue.models import FairShareConfig, GroupQuota, UserQuota
from scheduler import queue as core

QUOTA_WINDOW_S = 30 * 24 * 3600.0
HALF_LIVES_KEPT = 10  # usage older than ten half-lives weighs under 0.1 %: not read


@dataclass
class GroupStanding:
    """Per group (indexed by ``index``): share, decayed usage, fair-share factor, 30-day usage, quotas."""

    index: dict[int, int]
    names: list[str]
    shares: np.ndarray
    usage_gpu_s: np.ndarray
    factor: np.ndarray
    used_30d_gpu_s: np.ndarray
    max_gpus: np.ndarray
    max_gpu_s_30d: np.ndarray
    user_index: dict[tuple[int, int], int]  # (group pk, user pk) → the core's "user": a member's limits are per group
    user_used_30d_gpu_s: np.ndarray
    user_max_gpus: np.ndarray
    user_max_gpu_s_30d: np.ndarray


def weights(config: FairShareConfig) -> core.PriorityWeights:
    return core.PriorityWeights(class_weight=config.weight_class, fair_share_weight=config.weight_fair_share,
                                age_weight=config.weight_age, max_age_s=config.age_full_s,
                                half_life_s=config.half_life_s)


def group_standing(now: dt.datetime, config: FairShareConfig,
                   members: set[tuple[int, int]] | None = None) -> GroupStanding:
    """Every group's fair-share factor and quota use now (four statements: groups, quotas, user quotas, usage).

    Per-user limits and usage are per (group, user) pair — a ``UserQuota`` is a member's limit *within* one group,
    and only that group's jobs count against it (design §16.6); ``members`` adds pairs that have no limit (all
    np.inf) so that every job passed to the core has an index."""
    groups = list(ResearchGroup.objects.order_by("pk").values_list("pk", "name"))
    index = {pk: i for i, (pk, _) in enumerate(groups)}
    n = len(groups)
    shares = np.ones(n)
    max_gpus = np.full(n, np.inf)
    max_gpu_s = np.full(n, np.inf)
    for group_id, cap, hours, share in GroupQuota.objects.values_list("group_id", "max_gpus", "max_gpu_hours_30d",
                                                                      "share"):
        i = index[group_id]
        shares[i] = share
        max_gpus[i] = np.inf if cap is None else cap
        max_gpu_s[i] = np.inf if hours is None else hours * 3600.0
    user_rows = list(UserQuota.objects.values_list("group_id", "user_id", "max_gpus", "max_gpu_hours_30d"))
    users = sorted({(g, u) for g, u, _, _ in user_rows} | (members or set()))
    user_index = {pair: i for i, pair in enumerate(users)}
    user_max_gpus = np.full(len(users), np.inf)
    user_max_gpu_s = np.full(len(users), np.inf)
    for group_id, user_id, cap, hours in user_rows:  # one row per (group, user): that group's jobs only
        i = user_index[(group_id, user_id)]
        user_max_gpus[i] = np.inf if cap is None else cap
        user_max_gpu_s[i] = np.inf if hours is None else hours * 3600.0
    horizon = now - dt.timedelta(seconds=max(QUOTA_WINDOW_S, HALF_LIVES_KEPT * config.half_life_s))
    rows = list(Placement.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=horizon))
                .values_list("job__group_id", "job__owner_id", "job__gpu_count", "started_at", "ended_at"))
    usage = np.zeros(n)
    used_30d = np.zeros(n)
    user_used = np.zeros(len(users))
    if rows:
        gpus = np.array([r[2] for r in rows], dtype=float)
        started_ago = np.array([max(0.0, (now - r[3]).total_seconds()) for r in rows])
        ended_ago = np.array([0.0 if r[4] is None else max(0.0, (now - r[4]).total_seconds()) for r in rows])
        ended_ago = np.minimum(ended_ago, started_ago)
        group_of = np.array([index.get(r[0], -1) for r in rows])
        known = group_of >= 0
        decayed = core.decayed_gpu_seconds(gpus, started_ago, ended_ago, config.half_life_s)
        within = core.gpu_seconds_within(gpus, started_ago, ended_ago, QUOTA_WINDOW_S)
        usage = core.group_totals(group_of[known], decayed[known], n)
        used_30d = core.group_totals(group_of[known], within[known], n)
        user_of = np.array([user_index.get((r[0], r[1]), -1) for r in rows])
        mine = user_of >= 0
        if mine.any():
            user_used = core.group_totals(user_of[mine], within[mine], len(users))
    return GroupStanding(index=index, names=[name for _, name in groups], shares=shares, usage_gpu_s=usage,
                         factor=core.fair_share_factors(usage, shares), used_30d_gpu_s=used_30d, max_gpus=max_gpus,
                         max_gpu_s_30d=max_gpu_s, user_index=user_index, user_used_30d_gpu_s=user_used,
                         user_max_gpus=user_max_gpus, user_max_gpu_s_30d=user_max_gpu_s)
