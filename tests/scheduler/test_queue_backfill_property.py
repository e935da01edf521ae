"""EASY backfill over random queues and campuses (design §16.3): it never delays the reserved job's start, and
never leaves waiting a job that could start now without delaying it."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import queue as q


@st.composite
def campuses(draw):
    n = draw(st.integers(1, 4))
    gpus = np.array(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=n, max_size=n)))
    # some nodes open only later (a lending window), the others now
    frm = np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 500.0, 3000.0]), min_size=n, max_size=n)))
    rows = []
    for k in range(n):
        left = int(gpus[k])
        while left > 0 and draw(st.booleans()):
            g = draw(st.integers(1, left))
            rows.append((k, g, float(draw(st.integers(1, 40)) * 100), 10.0, 0, False))
            left -= g
    held = np.zeros(n, dtype=int)
    for k, g, *_ in rows:
        held[k] += g
    free = np.where(frm <= 0, gpus - held, 0)
    m = draw(st.integers(1, 12))
    w_gpus = np.array(draw(st.lists(st.sampled_from([1, 1, 1, 2, 4, 8]), min_size=m, max_size=m)))
    w_run = np.array(draw(st.lists(st.integers(1, 60), min_size=m, max_size=m)), dtype=float) * 100
    masks = draw(st.lists(st.integers(0, 2**n - 1), min_size=m, max_size=m))
    feasible = np.array([[bool(mask >> k & 1) or draw(st.booleans()) for k in range(n)] for mask in masks])
    priority = np.array(draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), dtype=float)
    cost = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=float)
    return gpus, free, frm, rows, w_gpus, w_run, feasible, priority, cost


def earliest(slots: list[float], g: int, frm: float) -> float:
    s = sorted(slots)
    return max(s[g - 1], frm) if len(s) >= g else np.inf


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(campuses())
def test_backfill_never_delays_the_reservation_and_never_leaves_a_startable_job_waiting(campus):
    gpus, free, frm, rows, w_gpus, w_run, feasible, priority, cost = campus
    n, m = gpus.size, w_gpus.size
    run = q.QueueRunning.empty() if not rows else q.QueueRunning(
        *(np.asarray(c) for c in zip(*rows, strict=True)))
    d = q.schedule(q.QueueNodes(gpus=gpus, free_gpus=free, available_from_s=frm, cost=cost), run,
                   q.QueueWaiting(priority=priority, gpus=w_gpus, runtime_s=w_run, feasible=feasible,
                                  group=np.zeros(m, dtype=int)))
    # the release profile each node starts from: running jobs' ends, idle GPUs free (at the window's opening)
    base = [[] for _ in range(n)]
    for k, g, end, *_ in rows:
        base[k] += [end] * g
    for k in range(n):
        base[k] += [0.0] * (int(gpus[k]) - len(base[k]))
    started = [j for j in range(m) if d.start_node[j] >= 0]
    # capacity: starts fit in the GPUs free now
    used = np.bincount(d.start_node[started], weights=w_gpus[started], minlength=n)
    assert np.all(used <= free)
    assert all(feasible[j, d.start_node[j]] and frm[d.start_node[j]] <= 0 for j in started)
    rank = np.empty(m, dtype=int)
    rank[d.order] = np.arange(m)

    def profile(jobs: list[int]) -> list[list[float]]:
        out = [list(s) for s in base]
        for j in jobs:
            s = sorted(out[d.start_node[j]])
            out[d.start_node[j]] = [w_run[j]] * int(w_gpus[j]) + s[int(w_gpus[j]):]
        return out

    r = d.reserved_job
    if r >= 0:
        k, g = d.reserved_node, int(w_gpus[r])
        assert feasible[r, k] and d.reason[r] == "reserved" and d.start_node[r] == -1
        before = profile([j for j in started if rank[j] < rank[r]])
        # the reservation is the reserved job's earliest start given the jobs ahead of it...
        best = min(earliest(before[x], g, frm[x]) for x in range(n) if feasible[r, x])
        assert d.reserved_start_s == best == earliest(before[k], g, frm[k])
        # ...and what started behind it does not delay it
        after = profile(started)
        assert earliest(after[k], g, frm[k]) <= d.reserved_start_s
        assert d.estimated_start_s[r] == d.reserved_start_s
        extra = sum(1 for t in after[k] if t <= d.reserved_start_s) - g
    left = free - used
    for j in range(m):
        if d.start_node[j] >= 0:
            assert d.estimated_start_s[j] == 0.0
            continue
        if d.reason[j] in ("reserved", "never fits"):
            continue
        assert d.reason[j] in ("no free GPUs", "behind reservation"), d.reason[j]
        g = int(w_gpus[j])
        for k in range(n):
            if feasible[j, k] and frm[k] <= 0 and left[k] >= g:
                # it fits on k now: only the reservation may hold it back
                assert r >= 0 and rank[j] > rank[r] and k == d.reserved_node
                assert w_run[j] > d.reserved_start_s and g > extra
    # every job some node could take gets an estimate no earlier than now
    for j in range(m):
        ever = any(feasible[j, k] and gpus[k] >= w_gpus[j] for k in range(n))
        assert np.isfinite(d.estimated_start_s[j]) == ever
        assert d.estimated_start_s[j] >= 0
