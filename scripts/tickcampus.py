"""A campus of any size in the database, as a running portal would hold it, for timing the control tick.

Used by ``scripts/bench_tick.py`` (``make bench-tick``) and by the test that pins the tick's query count
(``tests/control/test_tick_queries.py``). Django must be set up by the caller. Everything is written in bulk
(``bulk_create``; bandwidth samples with PostgreSQL's COPY), so 5,000 nodes take seconds, not hours:

- buildings of ~25 nodes each under one core switch (10 Gbit/s uplinks), labs of ~20 nodes;
- nodes of 2, 4 or 8 GPUs (mixed models), some with a floor of one, every one online with a live agent;
- running jobs on ~80 % of the lendable GPUs, each with a checkpoint per half hour it has run (at most a day's),
  the newest pre-synced to another node;
- a few queued jobs no node can take (16 GPUs), as a real queue has;
- a week of departures (emergency reclaims, kill-switches, lost heartbeats: about one per node per day), each
  with the node's availability record (lent a week ago, reclaimed at the departure, lent again within the hour);
- ``samples_per_link`` bandwidth samples per access link, one a minute up to now (a day = 1,440);
- traffic-class samples (research, checkpoint, other bytes) from every node, one a minute as the portal keeps
  them (``CLASS_SAMPLE_PERIOD_S``), for the last few minutes: what P1's work-conserving reserve reads.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import random
from dataclasses import dataclass
from typing import Any

GPU_MODELS = (("RTX 3090", 24.0, "8.6"), ("RTX 4090", 24.0, "8.9"), ("A100", 80.0, "8.0"), ("RTX A6000", 48.0, "8.6"))
NODES_PER_BUILDING = 25
NODES_PER_LAB = 20
BUSY_FRACTION = 0.8
CHECKPOINT_HISTORY = 48  # checkpoints kept per running job (a day at one per half hour)
CLASS_SAMPLE_MINUTES = 3  # minutes of class samples written at build (P1 reads the last 2)


@dataclass(frozen=True)
class Built:
    nodes: int
    gpus: int
    lendable_gpus: int
    running_jobs: int
    queued_jobs: int
    departures: int
    samples: int


def build(n_nodes: int, *, seed: int = 0, samples_per_link: int = 1440, now: dt.datetime | None = None) -> Built:
    """Write a campus of ``n_nodes`` into an empty database (its migrations applied)."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.db.models import F
    from django.utils import timezone

    from portal.control.models import AgentSession, JobRuntime
    from portal.core.lifecycle.jobs import JobState
    from portal.core.lifecycle.nodes import NodeState
    from portal.core.models import (
        Building,
        Checkpoint,
        Gpu,
        Job,
        Link,
        LinkEstimate,
        Node,
        NodeAvailability,
        Placement,
        Provider,
        ReclaimEvent,
        ReclaimKind,
        ReclaimOutcome,
        ResearchGroup,
        Switch,
    )

    rng = random.Random(seed)
    now = now or timezone.now()
    with transaction.atomic():
        core = Switch.objects.create(name="core", tier=Switch.Tier.CORE)
        n_buildings = max(1, -(-n_nodes // NODES_PER_BUILDING))
        buildings = Building.objects.bulk_create([Building(name=f"Building {b:04d}") for b in range(n_buildings)])
        switches = Switch.objects.bulk_create([Switch(name=f"sw-{b.pk}", tier=Switch.Tier.BUILDING, building=b)
                                               for b in buildings])
        Link.objects.bulk_create([Link(name=f"uplink-{s.pk}", kind=Link.Kind.UPLINK, upper=core, lower_switch=s,
                                       capacity_bytes_per_s=1.25e9) for s in switches])
        labs = Provider.objects.bulk_create([Provider(name=f"Lab {p:04d}", slug=f"lab-{p:04d}")
                                             for p in range(max(1, -(-n_nodes // NODES_PER_LAB)))])
        group = ResearchGroup.objects.create(name="Bench Group", slug="bench-group")
        user = get_user_model().objects.create(username="bench-researcher")
        access = Link.objects.bulk_create([
            Link(name=f"access-bench-{i:05d}", kind=Link.Kind.ACCESS, upper=switches[i // NODES_PER_BUILDING],
                 capacity_bytes_per_s=rng.choice((125e6, 1.25e9))) for i in range(n_nodes)])
        nodes = Node.objects.bulk_create([
            Node(name=f"bench-{i:05d}", provider=labs[i // NODES_PER_LAB], building=buildings[i // NODES_PER_BUILDING],
                 access_link=access[i], state=NodeState.ONLINE, gpu_floor=1 if rng.random() < 0.2 else 0,
                 agent_token_hash=hashlib.sha256(f"bench-{seed}-{i}".encode()).hexdigest(),
                 agent_token_prefix=f"rna_bench{i}"[:12], last_heartbeat_at=now)
            for i in range(n_nodes)], batch_size=2000)
        gpu_rows, gpus_of = [], []
        for node in nodes:
            count = rng.choice((2, 4, 4, 8))
            model, vram, cc = rng.choice(GPU_MODELS)
            gpus_of.append(count)
            gpu_rows += [Gpu(node=node, index=g, model=model, vram_gb=vram, compute_capability=cc)
                         for g in range(count)]
        Gpu.objects.bulk_create(gpu_rows, batch_size=5000)
        AgentSession.objects.bulk_create([
            AgentSession(node=node, channel_name=f"bench.{node.pk}", data_host="127.0.0.1", data_port=20000 + i % 40000)
            for i, node in enumerate(nodes)], batch_size=5000)
        LinkEstimate.objects.bulk_create([
            LinkEstimate(link=link, mean_bytes_per_s=0.7 * link.capacity_bytes_per_s,
                         lower_bytes_per_s=0.5 * link.capacity_bytes_per_s) for link in access], batch_size=5000)
        jobs, placed_on = [], []
        lendable = 0
        for node, count in zip(nodes, gpus_of, strict=True):
            offered = Node.lendable_of(count, node.gpu_floor)
            lendable += offered
            used = 0
            while used < BUSY_FRACTION * offered:
                size = min(rng.choice((1, 1, 2)), offered - used)
                jobs.append(Job(name=f"bench-job-{len(jobs)}", owner=user, group=group, command="python train.py",
                                gpu_count=size, expected_runtime_s=rng.uniform(3600, 7 * 86400),
                                ckpt_bytes_estimate=int(rng.uniform(1e8, 2e10)), restart_s=rng.uniform(5, 60),
                                loss_budget_s=rng.choice((None, 600.0, 1800.0)), state=JobState.RUNNING,
                                started_at=now - dt.timedelta(seconds=rng.uniform(60, 86400))))
                placed_on.append((node, list(range(used, used + size))))
                used += size
        queued = [Job(name=f"bench-queued-{q}", owner=user, group=group, command="python train.py", gpu_count=16,
                      expected_runtime_s=86400, ckpt_bytes_estimate=int(1e10), state=JobState.QUEUED)
                  for q in range(max(1, n_nodes // 100))]
        jobs = Job.objects.bulk_create(jobs + queued, batch_size=5000)
        running = jobs[: len(placed_on)]
        Placement.objects.bulk_create([Placement(job=job, node=node, gpu_indices=indices)
                                       for job, (node, indices) in zip(running, placed_on, strict=True)],
                                      batch_size=5000)
        JobRuntime.objects.bulk_create([JobRuntime(job=job) for job in running], batch_size=5000)
        # Each job's history: one checkpoint per half hour it has run (at most CHECKPOINT_HISTORY), each copied
        # to a replica (its transfer time known), taken synchronously; the newest completed 20 s ago.
        history = [Checkpoint(job=job, sequence=seq, node=node, sha256="0" * 64,
                              size_bytes=int(job.ckpt_bytes_estimate * rng.uniform(0.8, 1.2)),
                              taken_at=now - dt.timedelta(seconds=1800.0 * (count - seq) + 60),
                              completed_at=now - dt.timedelta(seconds=1800.0 * (count - seq) + 20),
                              transfer_s=rng.uniform(5, 120))
                   for job, (node, _) in zip(running, placed_on, strict=True)
                   for count in [min(CHECKPOINT_HISTORY, 1 + int((now - job.started_at).total_seconds() // 1800))]
                   for seq in range(1, count + 1)]
        Checkpoint.objects.bulk_create(history, batch_size=5000)
        ckpts = list({c.job_id: c for c in history}.values())  # each job's newest (history is in sequence order)
        replica = Checkpoint.replica_nodes.through
        replica.objects.bulk_create([replica(checkpoint_id=c.pk, node_id=nodes[(k * 7 + 1) % n_nodes].pk)
                                     for k, c in enumerate(ckpts)], batch_size=5000)
        departures, availability = [], []
        week_ago = now - dt.timedelta(days=7)
        for node in nodes:
            availability.append(NodeAvailability(node=node, at=week_ago, state=NodeState.ONLINE, lent=True))
            times = sorted(rng.uniform(3600, 7 * 86400 - 3600) for _ in range(rng.randint(4, 10)))
            for ago_s in times[::-1]:  # oldest first; each one back online within the hour
                at = now - dt.timedelta(seconds=ago_s)
                departures.append(ReclaimEvent(node=node, kind=rng.choice((ReclaimKind.EMERGENCY, ReclaimKind.KILLSWITCH,
                                                                            ReclaimKind.HEARTBEAT_LOST)),
                                               notice_s=0.0, deadline_at=at, finished_at=at,
                                               outcome=ReclaimOutcome.DEGRADED))
                availability.append(NodeAvailability(node=node, at=at, state=NodeState.RECLAIMED, lent=False))
                availability.append(NodeAvailability(node=node, at=at + dt.timedelta(seconds=rng.uniform(60, 3000)),
                                                     state=NodeState.ONLINE, lent=True))
        ReclaimEvent.objects.bulk_create(departures, batch_size=5000)
        NodeAvailability.objects.bulk_create(availability, batch_size=5000)
        # requested_at is auto_now_add: date the departures back to when they happened.
        ReclaimEvent.objects.filter(kind__in=(ReclaimKind.EMERGENCY, ReclaimKind.KILLSWITCH,
                                              ReclaimKind.HEARTBEAT_LOST)).update(requested_at=F("deadline_at"))
    samples = add_samples(access, samples_per_link, now, rng, connection)
    for k in range(CLASS_SAMPLE_MINUTES):
        add_class_samples(now - dt.timedelta(seconds=60.0 * k), rng, every_node=True)
    return Built(nodes=n_nodes, gpus=sum(gpus_of), lendable_gpus=lendable, running_jobs=len(running),
                 queued_jobs=len(queued), departures=len(departures), samples=samples)


def add_samples(links: list[Any], per_link: int, now: dt.datetime, rng: random.Random, connection: Any,
                spacing_s: float = 60.0) -> int:
    """``per_link`` egress samples per link, ``spacing_s`` apart up to ``now`` (COPY on PostgreSQL)."""
    from portal.core.models import BandwidthSample

    if per_link <= 0 or not links:
        return 0
    if connection.vendor != "postgresql":
        BandwidthSample.objects.bulk_create([
            BandwidthSample(link_id=link.pk, sampled_at=now - dt.timedelta(seconds=spacing_s * k),
                            bytes_per_s=rng.uniform(0.05, 0.6) * link.capacity_bytes_per_s)
            for link in links for k in range(per_link)], batch_size=5000)
        return per_link * len(links)
    table = BandwidthSample._meta.db_table
    buffer = io.StringIO()
    for k in range(per_link):
        at = (now - dt.timedelta(seconds=spacing_s * (per_link - 1 - k))).isoformat()
        for link in links:
            buffer.write(f"{link.pk}\t{at}\t{rng.uniform(0.05, 0.6) * link.capacity_bytes_per_s:.1f}\n")
    with connection.cursor() as cur:
        raw = cur.cursor  # psycopg 3
        with raw.copy(f"COPY {table} (link_id, sampled_at, bytes_per_s) FROM STDIN") as copy:
            copy.write(buffer.getvalue())
    return per_link * len(links)


def research_share(node_pk: int, rng: random.Random) -> float:
    """The share of its access link a node's research traffic took in one minute: a level of its own (0–30 %,
    fixed per node: a lab's traffic persists from minute to minute) with ±3 % of jitter."""
    level = 0.3 * ((node_pk * 2654435761) % 1000) / 1000
    return level * (1.0 + rng.uniform(-0.03, 0.03))


def add_class_samples(now: dt.datetime, rng: random.Random, *, every_node: bool = False) -> int:
    """Access-link class samples at ``now``: from every node, or (between two 10 s ticks) from the sixth of the
    nodes whose minute comes round then, as the portal stores one per node per minute."""
    from portal.core.models import LinkClassSample, LinkScope, Node

    slot = int(now.timestamp() // 10) % 6
    rows = [LinkClassSample(link_id=link, node_id=pk, scope=LinkScope.ACCESS, sampled_at=now, interval_s=60.0,
                            research_bytes=int(research_share(pk, rng) * capacity * 60.0),
                            checkpoint_bytes=int(rng.uniform(0.0, 0.1) * capacity * 60.0), other_bytes=0,
                            source="tc")
            for pk, link, capacity in Node.objects.filter(access_link__isnull=False).values_list(
                "pk", "access_link_id", "access_link__capacity_bytes_per_s")
            if every_node or pk % 6 == slot]
    LinkClassSample.objects.bulk_create(rows, batch_size=5000)
    return len(rows)


def agents_report(now: dt.datetime, rng: random.Random) -> None:
    """What the agents do between two ticks: a heartbeat from every node, one egress sample per access link and
    the class samples whose minute has come."""
    from django.db import connection

    from portal.core.models import Link, Node

    Node.objects.update(last_heartbeat_at=now)
    add_samples(list(Link.objects.filter(kind=Link.Kind.ACCESS).only("pk", "capacity_bytes_per_s")), 1, now, rng,
                connection)
    add_class_samples(now, rng)
