"""A believable past for the pages to show: ``manage.py seed_history`` (after ``seed_campus``).

The control plane writes this history as it runs; a fresh demo or a browser test has none, and an empty
dashboard shows nothing. This writes two days of it in the shape the control plane would: nodes online, jobs
placed and checkpointed, scheduled and emergency reclaims at the paper's peak hours (design §6: 11:30-13:00 and
17:30-20:00, 42 % emergency), migrations (planned/degraded, downtime, work lost), an hourly campus hazard
profile, bandwidth samples and estimates per building uplink, and P1/P3 decisions at times inside the history.
Every node is lent from the history's start (``NodeAvailability``, what the dashboard's utilisation of a past
hour divides by, design §9.1); with ``past_only``, a node not lent now stops being lent at ``now``.

It moves states only through the lifecycles, and refuses to run twice (it does nothing if any migration
exists). Deterministic for a given ``seed``.
"""

from __future__ import annotations

import hashlib
import math
import random
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from portal.control.loop.estimates import write_level_profile
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    BandwidthSample,
    Checkpoint,
    DecisionLog,
    HazardScope,
    Job,
    Link,
    LinkEstimate,
    Migration,
    MigrationMode,
    Node,
    NodeAvailability,
    Placement,
    ReclaimEvent,
    ReclaimKind,
    ReclaimOutcome,
    ResearchGroup,
)

GB = 1_000_000_000
PEAKS = ((11.5, 13.0), (17.5, 20.0))


def hourly_hazard_per_s(hour: int) -> float:
    """The paper's diurnal shape (6x at the peaks versus off-peak), scaled to this history's reclaim rate."""
    peak = any(start <= hour + 0.5 < end for start, end in PEAKS)
    return (0.09 if peak else 0.015) / 3600


def _owner(group: ResearchGroup) -> Any:
    member = group.members.first()
    if member is not None:
        return member
    user, _ = get_user_model().objects.get_or_create(username=f"{group.slug}-bot")
    return user


def seed_history(
    *, now: datetime | None = None, hours: int = 48, seed: int = 7, past_only: bool = False
) -> dict[str, int]:
    """Write ``hours`` of history ending at ``now``; returns counts of what was created.

    ``past_only``: leave node states alone and finish every job it created, so that a live control plane
    (``make demo``) inherits charts full of history but no running job on a node without an agent.
    """
    if Migration.objects.exists():
        return {"skipped": 1}
    rng = random.Random(seed)
    now = now or timezone.now()
    start = now - timedelta(hours=hours)
    with transaction.atomic():
        nodes = list(Node.objects.exclude(state=NodeState.RETIRED).prefetch_related("gpus").order_by("name"))
        for node in [] if past_only else nodes:
            if node.state in (NodeState.REGISTERED, NodeState.OFFLINE):
                node_lifecycle.come_online(node)
            Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 2)))
        _lent_since(nodes, start, now, past_only)
        counts = {"nodes": len(nodes)}
        counts |= _hazard_and_bandwidth(rng, now, start)
        counts |= _jobs_and_reclaims(rng, nodes, now, start, past_only)
    return counts


def _lent_since(nodes: list[Node], start: datetime, now: datetime, past_only: bool) -> None:
    """Record every node as lent from ``start`` (the history's jobs ran on them): the node lifecycle's own
    rows from this run are moved back to ``start``; with ``past_only`` (the nodes keep their state), each node
    gets a lent row at ``start`` and, unless it is lent now, a row at ``now`` that ends the lending."""
    if not past_only:
        NodeAvailability.objects.filter(node__in=nodes, at__gte=now).update(at=start)
        return
    rows = []
    for node in nodes:
        rows.append(NodeAvailability(node=node, at=start, state=NodeState.ONLINE, lent=True))
        if node.state != NodeState.ONLINE or node.killswitch_engaged:
            rows.append(NodeAvailability(node=node, at=now, state=node.state, lent=False))
    NodeAvailability.objects.bulk_create(rows)


def _hazard_and_bandwidth(rng: random.Random, now: datetime, start: datetime) -> dict[str, int]:
    profile = [hourly_hazard_per_s(hour) for hour in range(24)]
    write_level_profile(HazardScope.CAMPUS, profile, [lam * 1.3 for lam in profile])
    samples = []
    uplinks = list(Link.objects.filter(kind=Link.Kind.UPLINK))
    t = start
    while t < now:
        hour = timezone.localtime(t).hour
        # Available bandwidth dips when reclaims peak (design §6: corr(λ, B_eff) = -0.43).
        busy = 0.45 if hourly_hazard_per_s(hour) > hourly_hazard_per_s(0) else 0.8
        for link in uplinks:
            samples.append(BandwidthSample(link=link, sampled_at=t,
                                           bytes_per_s=link.capacity_bytes_per_s * busy * rng.uniform(0.7, 1.1)))
        t += timedelta(minutes=30)
    BandwidthSample.objects.bulk_create(samples)
    for link in uplinks:
        LinkEstimate.objects.update_or_create(
            link=link,
            defaults={"mean_bytes_per_s": link.capacity_bytes_per_s * rng.uniform(0.55, 0.75),
                      "lower_bytes_per_s": link.capacity_bytes_per_s * rng.uniform(0.35, 0.5)},
        )
        flows = [{"id": f"mig-{link.pk}-{i}", "bytes": rng.choice([2, 3.2, 8, 16]) * GB,
                  "notice_s": rng.choice([60, 120, 300]), "restart_s": 30} for i in range(rng.randint(1, 4))]
        budget = link.capacity_bytes_per_s * 0.7
        admitted, degraded, used = [], [], 0.0
        for flow in sorted(flows, key=lambda f: f["notice_s"]):
            rate = flow["bytes"] / (flow["notice_s"] - flow["restart_s"])
            if used + rate <= budget:
                admitted.append({"id": flow["id"], "min_rate": rate, "rate": rate})
                used += rate
            else:
                degraded.append({"id": flow["id"], "reason": "capacity"})
        decision = DecisionLog.objects.create(
            kind=DecisionLog.Kind.P3,
            request={"link": link.name, "capacity_bytes_per_s": link.capacity_bytes_per_s, "reserve_fraction": 0.3,
                     "flows": flows, "research_bytes_per_s": link.capacity_bytes_per_s * rng.uniform(0.25, 0.55)},
            response={"migration_budget_bytes_per_s": budget, "admitted": admitted, "degraded": degraded},
        )
        # Decided some time during the history (what the dashboard lists as history, never as in flight).
        decided_at = start + (now - start) * rng.uniform(0.1, 0.9)
        DecisionLog.objects.filter(pk=decision.pk).update(created_at=decided_at)
    return {"bandwidth_samples": len(samples)}


def _jobs_and_reclaims(
    rng: random.Random, nodes: list[Node], now: datetime, start: datetime, past_only: bool
) -> dict[str, int]:
    groups = list(ResearchGroup.objects.order_by("name"))
    if not groups or len(nodes) < 2:
        return {"jobs": 0}
    jobs = migrations = reclaims = 0
    busy_nodes = rng.sample(nodes, k=max(2, len(nodes) * 2 // 3))
    for i, node in enumerate(busy_nodes):
        group = groups[i % len(groups)]
        gpus = len(node.gpus.all()) or 1
        placed_at = start + timedelta(hours=rng.uniform(0, 6))
        job = Job.objects.create(
            name=f"{rng.choice(['llama-ft', 'vit-pretrain', 'unet-seg', 'gnn-md', 'bert-mlm', 'diffusion'])}-{i:02d}",
            owner=_owner(group), group=group, command="python train.py --config cfg.yaml", framework="pytorch",
            gpu_count=gpus, vram_gb_per_gpu=16, expected_runtime_s=72 * 3600,
            ckpt_bytes_estimate=int(rng.choice([1.2, 3.2, 3.2, 8, 16]) * GB), loss_budget_s=1800, restart_s=30,
        )
        jobs += 1
        Job.objects.filter(pk=job.pk).update(submitted_at=placed_at - timedelta(minutes=2))
        job.refresh_from_db()
        current, t = node, placed_at
        placement = _place(job, current, t)
        sequence = 0
        # Every few hours this job's node is reclaimed; it migrates to another node.
        while True:
            t_next = t + timedelta(hours=rng.uniform(4, 14))
            sequence = _checkpoints(rng, job, current, t, min(t_next, now), sequence)
            if t_next >= now:
                break
            emergency = rng.random() < 0.42
            # Most reclaims fall in the paper's peak hours.
            candidate = t_next.replace(hour=rng.choice([12, 12, 18, 19, 9, 15, 22, 3]))
            if t < candidate < now:
                t_next = candidate
            notice = 0.0 if emergency else float(rng.choice([60, 120, 300, 600]))
            reclaim = ReclaimEvent.objects.create(
                node=current, kind=ReclaimKind.EMERGENCY if emergency else ReclaimKind.SCHEDULED,
                notice_s=notice, deadline_at=t_next + timedelta(seconds=notice),
                finished_at=t_next + timedelta(seconds=notice or 5),
                outcome=ReclaimOutcome.DEGRADED if emergency else ReclaimOutcome.COMPLETED,
                outcome_detail="resumed from the last pre-synced checkpoint" if emergency else "",
            )
            ReclaimEvent.objects.filter(pk=reclaim.pk).update(requested_at=t_next)
            reclaims += 1
            fits = [n for n in nodes if n.pk != current.pk and len(n.gpus.all()) >= gpus]
            if not fits:
                break
            destination = rng.choice(fits)
            downtime = rng.uniform(70, 240) if emergency else rng.uniform(35, 95)
            lost = rng.uniform(60, 900) if emergency else 0.0
            migration = Migration.objects.create(
                job=job, reclaim=reclaim, source=current, destination=destination,
                mode=MigrationMode.DEGRADED if emergency else MigrationMode.PLANNED,
                degraded_reason="emergency" if emergency else "", bytes=job.ckpt_bytes_estimate,
                assigned_rate_bytes_per_s=rng.uniform(30e6, 100e6), dscp=46 if emergency else 34,
                finished_at=t_next + timedelta(seconds=downtime), downtime_s=downtime, work_lost_s=lost,
                success=rng.random() > 0.08,
            )
            Migration.objects.filter(pk=migration.pk).update(started_at=t_next)
            migrations += 1
            Placement.objects.filter(pk=placement.pk).update(ended_at=t_next, end_reason="reclaimed")
            job_lifecycle.begin_migration(job)
            current, t = destination, t_next + timedelta(seconds=downtime)
            placement = _place(job, current, t, restart=True)
            group.gpu_hours_lost_to_reclaims += lost * gpus / 3600
        end = now
        if past_only:  # the job finished a little while ago
            end = max(t + timedelta(minutes=1), now - timedelta(minutes=rng.uniform(2, 30)))
            Placement.objects.filter(pk=placement.pk).update(ended_at=end, end_reason="completed")
            job_lifecycle.complete(job)
        hours_run = (end - placed_at).total_seconds() / 3600
        group.gpu_hours_used += hours_run * gpus
        group.save(update_fields=["gpu_hours_used", "gpu_hours_lost_to_reclaims"])
        Job.objects.filter(pk=job.pk).update(work_done_s=hours_run * 3600 * 0.95)
        _p1_decision(rng, job)
    return {"jobs": jobs, "reclaims": reclaims, "migrations": migrations}


def _place(job: Job, node: Node, at: datetime, restart: bool = False) -> Placement:
    placement = Placement.objects.create(job=job, node=node, gpu_indices=list(range(job.gpu_count)))
    Placement.objects.filter(pk=placement.pk).update(started_at=at)
    job_lifecycle.start(job)
    if not restart:
        Job.objects.filter(pk=job.pk).update(started_at=at)
    return placement


def _checkpoints(rng: random.Random, job: Job, node: Node, t0: datetime, t1: datetime, sequence: int) -> int:
    interval = timedelta(minutes=rng.uniform(20, 45))
    t = t0 + interval
    while t < t1:
        sequence += 1
        took = rng.uniform(8, 40)
        ckpt = Checkpoint.objects.create(
            job=job, sequence=sequence, node=node, step=sequence * 500,
            size_bytes=int(job.ckpt_bytes_estimate * rng.uniform(0.95, 1.05)),
            sha256=hashlib.sha256(f"{job.pk}-{sequence}".encode()).hexdigest(),
            taken_at=t, completed_at=t + timedelta(seconds=took), gpu_model="RTX 3090",
            framework="pytorch", framework_version="2.5.1",
        )
        replicas = list(Node.objects.filter(building=node.building).exclude(pk=node.pk)[:1])
        ckpt.replica_nodes.set(replicas)
        t += interval
    return sequence


def _p1_decision(rng: random.Random, job: Job) -> None:
    lam = hourly_hazard_per_s(timezone.localtime().hour) * 1.3
    bandwidth = rng.uniform(20e6, 60e6)
    interval = min(math.sqrt(2 * job.ckpt_bytes_estimate / (lam * bandwidth)), 2 * (job.loss_budget_s or 1800))
    DecisionLog.objects.create(
        kind=DecisionLog.Kind.P1, job=job,
        request={"budget_bytes_per_s": 250e6, "beta": 0.2,
                 "jobs": [{"id": str(job.pk), "hazard_per_s": lam, "ckpt_bytes": job.ckpt_bytes_estimate,
                           "loss_budget_s": job.loss_budget_s, "restart_s": job.restart_s}]},
        response={"jobs": [{"id": str(job.pk), "bandwidth_bytes_per_s": bandwidth, "interval_s": interval,
                            "final_checkpoint": False, "loss_budget_at_risk": False}],
                  "expected_cost": 0.0},
    )
    Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=interval, checkpoint_bandwidth_bytes_per_s=bandwidth)
