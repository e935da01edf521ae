"""The campus read model (design §9.1): the one answer to "what does the campus look like now".

Every consumer — the control tick, placement, the reclaim planner and its preview, the provider pages, the
dashboard, the summary API and ``/metrics`` — reads these functions, so they cannot disagree:

- :func:`hazard_upper_by_hour` — λ⁺ per node and hour with its one fallback chain (design §2 estimators):
  the node's own estimate, else its provider's, else the campus's, else :data:`PRIOR_HAZARD_PER_S`.
- :func:`lendable_gpus_total` — GPUs of lent nodes (online, kill-switch off) minus each node's floor
  (``Node.lendable_of``).
- :func:`link_available_bytes_per_s` — B⁻ of a link: its estimate's lower bound within (0, capacity], else
  the capacity.
- :func:`checkpoint_size_bytes` — a job's next checkpoint is about as large as its last one; before any, the
  researcher's estimate.
- :func:`load` — the whole snapshot a decision needs (:class:`Campus`): tree, link bandwidths, free GPUs of
  lent nodes with a live agent, hardware, hazard; :meth:`Campus.feasible` is a job's feasible nodes.
  A node with lending windows takes work only inside one and not within the window notice of its end
  (:func:`window_states`, on the pure ``scheduler.windows`` the explanation also uses; design §9.13).
- :func:`gpu_time` — the same counts over the past: per period, GPU-seconds lent (each node's lendable GPUs
  while ``NodeAvailability`` says it was lent) and busy (placements on lent nodes), for the dashboard's
  utilisation of past hours; :func:`migration_traffic_now` — the migration copies on the wire now, per link.

Nothing here writes. The estimator (``portal.control.loop.estimates``) is the only writer of the estimates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Min, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from portal.control.models import (
    AgentSession,
    MigrationPhase,
    MigrationWork,
    Transfer,
    TransferPurpose,
    TransferState,
)
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Checkpoint,
    Gpu,
    HazardEstimate,
    HazardScope,
    Job,
    LendingWindow,
    Link,
    LinkEstimate,
    Node,
    NodeAvailability,
    Placement,
    ReclaimEvent,
    ReclaimKind,
)
from scheduler import windows as lending
from scheduler.p2 import feasible_mask
from scheduler.p3 import migration_budget_bytes_per_s
from scheduler.topology import CampusTree

PRIOR_HAZARD_PER_S = 1 / 3600.0  # one emergency reclaim per lent hour until the estimator has data
HAZARD_FLOOR_PER_S = 1e-9  # P1's interval and P2's survival need λ > 0
HOURS = 24
# Above this many rows asked for, a read takes the whole table instead of a long IN list (the hazard read here,
# the links' reserve and research use in portal.control.reserve).
IN_LIST_MAX = 64


# --- hazard ------------------------------------------------------------------------------------------------------


def hazard_upper_by_hour(
    node_pks: Sequence[int], provider_of: dict[int, int] | None = None, *, hour: int | None = None,
    upper: bool = True,
) -> np.ndarray:
    """λ⁺ (or λ̂ with ``upper=False``) per node: an (n, 24) array by hour, or (n,) at ``hour``.

    One chain for every hour: the node's estimate, else its provider's, else the campus's, else the prior;
    never below HAZARD_FLOOR_PER_S. ``provider_of`` (node pk → provider pk) saves a query when known.
    """
    n = len(node_pks)
    columns = HOURS if hour is None else 1
    out = np.full((n, columns), PRIOR_HAZARD_PER_S)
    if n == 0:
        return out if hour is None else out[:, 0]
    index = {pk: i for i, pk in enumerate(node_pks)}
    if provider_of is None:
        nodes = Node.objects.all() if n > IN_LIST_MAX else Node.objects.filter(pk__in=list(node_pks))
        provider_of = {pk: provider for pk, provider in nodes.values_list("pk", "provider_id") if pk in index}
    rows = HazardEstimate.objects.all()
    if hour is not None:
        rows = rows.filter(hour_of_day=hour % HOURS)
    if n <= IN_LIST_MAX:
        providers = sorted({p for p in provider_of.values() if p is not None})
        rows = rows.filter(Q(scope=HazardScope.CAMPUS) | Q(scope=HazardScope.PROVIDER, provider_id__in=providers)
                           | Q(scope=HazardScope.NODE, node_id__in=list(node_pks)))
    value_field = "hazard_upper_per_s" if upper else "hazard_per_s"
    campus: dict[int, float] = {}
    by_provider: dict[int, dict[int, float]] = {}
    node_rows: list[tuple[int, int, float]] = []
    for scope, node_id, provider_id, h, value in rows.values_list("scope", "node_id", "provider_id", "hour_of_day",
                                                                 value_field):
        if not 0 <= h < HOURS or value is None or not math.isfinite(value):
            continue
        col = h if hour is None else 0
        if scope == HazardScope.CAMPUS:
            campus[col] = value
        elif scope == HazardScope.PROVIDER and provider_id is not None:
            by_provider.setdefault(provider_id, {})[col] = value
        elif scope == HazardScope.NODE and node_id in index:
            node_rows.append((index[node_id], col, value))
    for col, value in campus.items():
        out[:, col] = value
    if by_provider:
        for pk, i in index.items():
            for col, value in by_provider.get(provider_of.get(pk), {}).items():  # type: ignore[arg-type]
                out[i, col] = value
    if node_rows:
        rows_i, cols, values = zip(*node_rows, strict=True)
        out[list(rows_i), list(cols)] = values
    np.maximum(out, HAZARD_FLOOR_PER_S, out=out)
    return out if hour is None else out[:, 0]


def campus_hazard_by_hour(*, upper: bool = False) -> dict[int, float]:
    """The campus-level hazard per hour for the dashboard: the campus rows, else the mean of the node rows
    (hours with no estimate at all are absent)."""
    value_field = "hazard_upper_per_s" if upper else "hazard_per_s"
    campus = dict(HazardEstimate.objects.filter(scope=HazardScope.CAMPUS).values_list("hour_of_day", value_field))
    if campus:
        return {int(h): float(v) for h, v in campus.items()}
    per_hour: dict[int, list[float]] = {}
    for h, v in HazardEstimate.objects.filter(scope=HazardScope.NODE).values_list("hour_of_day", value_field):
        per_hour.setdefault(int(h), []).append(float(v))
    return {h: sum(v) / len(v) for h, v in per_hour.items()}


# --- GPUs ----------------------------------------------------------------------------------------------------------


def lent_nodes() -> Any:
    """Nodes that lend their GPUs now: online and not kill-switched."""
    return Node.objects.filter(state=NodeState.ONLINE, killswitch_engaged=False)


def lendable_gpus_total() -> int:
    """The campus's lendable GPUs: over lent nodes, each node's GPUs minus its floor."""
    counts = dict(Gpu.objects.filter(node__in=lent_nodes()).values_list("node_id").annotate(
        n=Count("pk")).values_list("node_id", "n"))
    return sum(Node.lendable_of(counts.get(pk, 0), floor)
               for pk, floor in lent_nodes().values_list("pk", "gpu_floor"))


def most_gpus_free_on_a_lent_node() -> int:
    """An upper bound on what any one placement could get now: the most lendable GPUs not held by an open
    placement on any lent node (liveness and reservations only lower it). One aggregate statement, so the tick
    can skip loading the campus when the queue holds nothing that small."""
    node, gpu, placement, job = (m._meta.db_table for m in (Node, Gpu, Placement, Job))
    sql = (f'SELECT MAX(g.n - n.gpu_floor - COALESCE(h.held, 0)) FROM "{node}" n '
           f'JOIN (SELECT node_id, COUNT(*) AS n FROM "{gpu}" GROUP BY node_id) g ON g.node_id = n.id '
           f'LEFT JOIN (SELECT p.node_id, SUM(j.gpu_count) AS held FROM "{placement}" p JOIN "{job}" j '
           f'ON j.id = p.job_id WHERE p.ended_at IS NULL GROUP BY p.node_id) h ON h.node_id = n.id '
           f"WHERE n.state = %s AND NOT n.killswitch_engaged")
    with connection.cursor() as cur:
        cur.execute(sql, [NodeState.ONLINE])
        best = cur.fetchone()[0]
    return max(0, int(best or 0))


def gpus_held(gpu_indices: Sequence[int] | None, gpu_count: int) -> int:
    """The GPUs one placement holds: the indices it was given, else (none recorded) its job's GPU count."""
    return len(gpu_indices) if gpu_indices else int(gpu_count)


def busy_gpus_on_lent_nodes() -> int:
    """GPUs held by open placements on lent nodes (:func:`gpus_held` each)."""
    return sum(gpus_held(indices, count) for indices, count in Placement.objects.filter(
        ended_at__isnull=True, node__in=lent_nodes()).values_list("gpu_indices", "job__gpu_count"))


# --- GPUs over time ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTime:
    """Per period ``[edges[i], edges[i+1])``: GPU-seconds lent, GPU-seconds busy on lent nodes, node-seconds lent.

    Integrated over time, these are :func:`lendable_gpus_total` and :func:`busy_gpus_on_lent_nodes`: a node
    counts its lendable GPUs (``Node.lendable_of``, today's GPUs and floor) while it was lent, and a placement
    counts :func:`gpus_held` while it was open on a node that was lent."""

    lent_gpu_s: np.ndarray
    busy_gpu_s: np.ndarray
    lent_node_s: np.ndarray


def lent_periods(since: Any, until: Any, *, now: Any = None) -> tuple[dict[int, list[tuple[float, float]]],
                                                                       dict[int, int]]:
    """Per node, the periods (epoch seconds) within [since, until] it was lent, and its lendable GPUs.

    From ``NodeAvailability`` (one row per lifecycle move): lent at ``since`` as its last row before says, then
    as each row in the range says. A node with no row at all (created in bulk, never moved) counts as lent
    throughout exactly when it is lent now; from a node's last row on, it counts as lent only if it is also
    lent now, so the newest period always agrees with :func:`lendable_gpus_total`. Three statements.
    """
    now = now or timezone.now()
    since_s, until_s = since.timestamp(), until.timestamp()
    before = Subquery(NodeAvailability.objects.filter(node=OuterRef("pk"), at__lte=since)
                      .order_by("-at", "-id").values("lent")[:1])
    nodes = list(Node.objects.annotate(lent_before=before, moved=Exists(NodeAvailability.objects.filter(
        node=OuterRef("pk")))).values_list("pk", "gpu_floor", "state", "killswitch_engaged", "lent_before", "moved"))
    counts = dict(Gpu.objects.values_list("node_id").annotate(n=Count("pk")).values_list("node_id", "n"))
    moves: dict[int, list[tuple[float, bool]]] = {}
    for node_id, at, lent in NodeAvailability.objects.filter(at__gt=since, at__lte=until).order_by(
            "at", "id").values_list("node_id", "at", "lent"):
        moves.setdefault(node_id, []).append((at.timestamp(), bool(lent)))
    periods: dict[int, list[tuple[float, float]]] = {}
    lendable: dict[int, int] = {}
    for pk, floor, state, killswitch, lent_before, moved in nodes:
        lent_now = state == NodeState.ONLINE and not killswitch
        lendable[pk] = Node.lendable_of(counts.get(pk, 0), floor)
        if not moved:
            if lent_now:
                periods[pk] = [(since_s, until_s)]
            continue
        out: list[tuple[float, float]] = []
        lent, t = bool(lent_before), since_s
        for at_s, then in moves.get(pk, []):
            if lent and at_s > t:
                out.append((t, at_s))
            lent, t = then, max(t, at_s)
        if lent and (lent_now or until < now) and until_s > t:
            out.append((t, until_s))
        if out:
            periods[pk] = out
    return periods, lendable


def _integral(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    """Per period between ``edges_s``: the integral of sum(weight over the intervals covering t) dt, in
    O((intervals + edges) log intervals)."""
    keep = ends > starts
    if not keep.any():
        return np.zeros(len(edges_s) - 1)
    starts, ends, weights = starts[keep], ends[keep], weights[keep]
    t = np.concatenate([starts, ends])
    step = np.concatenate([weights, -weights])
    order = np.argsort(t, kind="stable")
    t, step = t[order], step[order]
    rate = np.cumsum(step)  # the sum of weights just after each event
    area = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(t))])
    return np.diff(np.interp(edges_s, t, area))


def gpu_time(edges: Sequence[Any], *, now: Any = None) -> GpuTime:
    """GPU-seconds lent and busy, and node-seconds lent, per period between consecutive ``edges`` (aware
    datetimes, ascending). Four statements whatever the campus's size."""
    now = now or timezone.now()
    since, until = edges[0], edges[-1]
    edges_s = np.array([e.timestamp() for e in edges], dtype=float)
    periods, lendable = lent_periods(since, until, now=now)
    rows = [(s, e, lendable.get(pk, 0)) for pk, spans in periods.items() for s, e in spans]
    lent_s = np.array([r[0] for r in rows], dtype=float)
    lent_e = np.array([r[1] for r in rows], dtype=float)
    lent_gpus = np.array([r[2] for r in rows], dtype=float)
    busy: list[tuple[float, float, float]] = []
    open_until_s = min(until, now).timestamp()
    for node_id, started, ended, indices, count in Placement.objects.filter(
            Q(ended_at__isnull=True) | Q(ended_at__gt=since), started_at__lt=until,
    ).values_list("node_id", "started_at", "ended_at", "gpu_indices", "job__gpu_count"):
        p_start, p_end = started.timestamp(), ended.timestamp() if ended else open_until_s
        held = gpus_held(indices, count)
        for s, e in periods.get(node_id, ()):
            lo, hi = max(s, p_start), min(e, p_end)
            if hi > lo:
                busy.append((lo, hi, held))
    busy_arr = np.array(busy, dtype=float).reshape(-1, 3)
    return GpuTime(
        lent_gpu_s=_integral(lent_s, lent_e, lent_gpus, edges_s),
        busy_gpu_s=_integral(busy_arr[:, 0], busy_arr[:, 1], busy_arr[:, 2], edges_s),
        lent_node_s=_integral(lent_s, lent_e, np.ones(len(rows)), edges_s),
    )


# --- migration traffic now ----------------------------------------------------------------------------------------


def migration_traffic_now(now: Any = None) -> list[dict[str, Any]]:
    """Per link, the migration copies on the wire now (design §4): planned migrations' and recoveries'
    transfers issued and neither received, failed nor expired, on the tree path between their two nodes.

    Each entry: ``link``, ``capacity_bytes_per_s``, ``available_bytes_per_s`` (B⁻), ``budget_bytes_per_s``
    (what P3 may give migrations there: B⁻ minus the research reserve), ``flows``, ``rate_bytes_per_s`` (the
    sum of their P3 rates; a copy without one counts 0) — sorted by link name; empty when nothing moves. One
    statement when nothing moves, four otherwise.
    """
    now = now or timezone.now()
    transfers = list(Transfer.objects.filter(
        state=TransferState.ISSUED, purpose__in=[TransferPurpose.MIGRATION, TransferPurpose.EMERGENCY],
        expires_at__gt=now, finished_at__isnull=True,
    ).values_list("source_id", "destination_id", "rate_bytes_per_s"))
    if not transfers:
        return []
    links = {pk: (name, upper, lower_switch, capacity) for pk, name, upper, lower_switch, capacity in
             Link.objects.values_list("pk", "name", "upper_id", "lower_switch_id", "capacity_bytes_per_s")}
    uplink_of = {lower_switch: pk for pk, (_, _, lower_switch, _) in links.items() if lower_switch is not None}
    ends = {pk for s, d, _ in transfers for pk in (s, d)}
    access = dict(Node.objects.filter(pk__in=list(ends)).values_list("pk", "access_link_id"))
    lower = dict(LinkEstimate.objects.values_list("link_id", "lower_bytes_per_s"))

    def to_root(node_pk: int) -> list[int]:
        path, link = [], access.get(node_pk)
        while link is not None and link in links and link not in path:
            path.append(link)
            link = uplink_of.get(links[link][1])
        return path

    per_link: dict[int, list[float]] = {}
    for source, destination, rate in transfers:
        up, down = to_root(source), to_root(destination)
        for link in set(up) ^ set(down):
            per_link.setdefault(link, []).append(float(rate or 0.0))
    fraction = float(settings.RECLAIMNET["RESERVE_FRACTION"])
    reserve_min = float(settings.RECLAIMNET["RESERVE_MIN_BYTES_PER_S"])
    out = []
    for link, rates in per_link.items():
        name, _, _, capacity = links[link]
        available = link_available_bytes_per_s(capacity, lower.get(link))
        out.append({"link": name, "capacity_bytes_per_s": float(capacity), "available_bytes_per_s": available,
                    "budget_bytes_per_s": float(migration_budget_bytes_per_s(available, fraction, reserve_min)),
                    "flows": len(rates), "rate_bytes_per_s": sum(rates)})
    return sorted(out, key=lambda e: e["link"])


# --- links and checkpoints ----------------------------------------------------------------------------------------


def link_available_bytes_per_s(capacity_bytes_per_s: float, lower_bytes_per_s: float | None) -> float:
    """B⁻ of one link (design §2 bandwidth estimator): the estimate's lower bound, at most the capacity and at
    least 1 B/s; the capacity before any estimate."""
    if lower_bytes_per_s is None or not math.isfinite(lower_bytes_per_s) or lower_bytes_per_s <= 0:
        return float(capacity_bytes_per_s)
    return max(1.0, min(float(lower_bytes_per_s), float(capacity_bytes_per_s)))


def newest_checkpoint_bytes(job_ref: str = "pk") -> Subquery:
    """An annotation: the size of the newest completed checkpoint of the job ``job_ref`` names (NULL before
    any), one index lookup per row (``checkpoint_sequence_unique``)."""
    return Subquery(Checkpoint.objects.filter(job=OuterRef(job_ref), completed_at__isnull=False)
                    .order_by("-sequence").values("size_bytes")[:1])


def checkpoint_size_bytes(job_pks: Iterable[int]) -> dict[int, float]:
    """Per job: the size of its newest completed checkpoint, else its submitted estimate (one query)."""
    rows = Job.objects.filter(pk__in=list(job_pks)).annotate(newest=newest_checkpoint_bytes()).values_list(
        "pk", "newest", "ckpt_bytes_estimate")
    return {pk: float(size if size is not None else estimate) for pk, size, estimate in rows}


# --- liveness and reservations --------------------------------------------------------------------------------------


def live_node_pks() -> set[int]:
    """Nodes with an open agent session that reported a data address, not declared lost (offline) or retired.

    A partitioned node's websocket can stay open long after its heartbeat stopped; the lost-heartbeat check
    marks it offline, and from then on it holds no usable replica and receives no copy."""
    return set(AgentSession.objects.filter(closed_at__isnull=True, data_port__isnull=False)
               .exclude(node__state__in=[NodeState.OFFLINE, NodeState.RETIRED])
               .values_list("node_id", flat=True))


def held_and_reserved_gpus() -> tuple[dict[int, int], dict[int, int]]:
    """GPUs held per node by open placements, and GPUs reserved per node by migrations in flight whose
    destination is chosen but whose job has not started there yet (two grouped queries)."""
    held = dict(Placement.objects.filter(ended_at__isnull=True).values("node_id")
                .annotate(n=Sum("job__gpu_count")).values_list("node_id", "n"))
    reserved = dict(MigrationWork.objects.filter(
        phase__in=[MigrationPhase.CHECKPOINTING, MigrationPhase.TRANSFERRING, MigrationPhase.STARTING],
        migration__destination__isnull=False,
    ).values("migration__destination_id").annotate(n=Sum("migration__job__gpu_count"))
        .values_list("migration__destination_id", "n"))
    return {k: int(v or 0) for k, v in held.items()}, {k: int(v or 0) for k, v in reserved.items()}


def idle_gpu_indices(node_pk: int) -> list[int]:
    """The node's GPU indices no open placement holds, ascending."""
    held: set[int] = set()
    for indices in Placement.objects.filter(node_id=node_pk, ended_at__isnull=True).values_list("gpu_indices",
                                                                                               flat=True):
        held.update(int(i) for i in indices or [])
    return sorted(i for i in Gpu.objects.filter(node_id=node_pk).values_list("index", flat=True) if i not in held)


def freshest_replica(job: Job, exclude_node_pk: int | None, live: set[int]) -> tuple[Checkpoint, int] | None:
    """The newest completed checkpoint of ``job`` held by a live node other than ``exclude_node_pk``
    (its own writer counts when that node is alive and not excluded), with the holder's pk (design §3)."""
    for ckpt in Checkpoint.objects.filter(job=job, completed_at__isnull=False).order_by("-sequence")[:20]:
        holders = set(ckpt.replica_nodes.values_list("pk", flat=True))
        if ckpt.node_id is not None:
            holders.add(ckpt.node_id)
        usable = sorted(h for h in holders if h != exclude_node_pk and h in live)
        if usable:
            return ckpt, usable[0]
    return None


# --- the snapshot ---------------------------------------------------------------------------------------------------


def node_vertex(pk: int) -> str:
    return f"node:{pk}"


@dataclass
class Campus:
    """One snapshot of the campus for a decision; arrays are indexed like ``node_pks`` / ``link_pks``.

    ``free_gpus`` counts only lent nodes with a live agent. Decisions that place several jobs at once take GPUs
    with :meth:`take_gpus` so that each sees the others; a planner that must write nothing works on
    :meth:`scratch`. What only a decision needs is read on first use: the hourly hazard profiles (the control
    tick needs only the current hour) and a node's idle GPU indices (``free_indices``, by node).
    """

    tree: CampusTree
    node_pks: list[int]
    index_of: dict[int, int]
    link_pks: list[int]
    link_names: list[str]
    link_capacity_bytes_per_s: np.ndarray
    link_available_bytes_per_s: np.ndarray
    building: np.ndarray
    provider_of: dict[int, int]
    access_link_of: dict[int, int]  # node pk → index of its access link
    free_gpus: np.ndarray
    vram_gb: np.ndarray
    capability: np.ndarray
    now_hour: float
    live: set[int] = field(default_factory=set)
    windows: dict[int, list[lending.Window]] = field(default_factory=dict)  # node pk → its lending windows
    window_state: dict[int, str] = field(default_factory=dict)  # "closed" | "closing": kept from work by its windows
    free_indices: dict[int, list[int]] = field(default_factory=dict)  # filled by idle_indices()
    _hazard: np.ndarray | None = None

    def idle_indices(self, node_pk: int) -> list[int]:
        """``node_pk``'s idle GPU indices as this snapshot's decisions left them (read once per node)."""
        if node_pk not in self.free_indices:
            self.free_indices[node_pk] = idle_gpu_indices(node_pk)
        return self.free_indices[node_pk]

    @property
    def hazard_per_s_by_hour(self) -> np.ndarray:
        if self._hazard is None:
            self._hazard = hazard_upper_by_hour(self.node_pks, self.provider_of)
        return self._hazard

    def path_links(self, src_pk: int, dst_pk: int) -> np.ndarray:
        return self.tree.path_links(self.index_of[src_pk], self.index_of[dst_pk])

    def bottleneck_bytes_per_s(self, src_pk: int, dst_pk: int, capacity: bool = False) -> float:
        links = self.path_links(src_pk, dst_pk)
        values = self.link_capacity_bytes_per_s if capacity else self.link_available_bytes_per_s
        return float(values[links].min()) if len(links) else math.inf

    def scratch(self) -> Campus:
        """A copy whose GPU bookkeeping can be changed without touching this one (the planner's preview)."""
        return dataclasses.replace(self, free_gpus=self.free_gpus.copy(),
                                   free_indices={k: list(v) for k, v in self.free_indices.items()})

    def take_gpus(self, node_pk: int, count: int) -> list[int]:
        """Hand ``count`` free GPUs of ``node_pk`` to one decision: the indices it may start on."""
        i = self.index_of[node_pk]
        self.free_gpus[i] -= count
        indices = self.idle_indices(node_pk)
        taken, self.free_indices[node_pk] = indices[:count], indices[count:]
        return taken

    def give_back(self, node_pk: int, indices: list[int], count: int) -> None:
        """Undo :meth:`take_gpus` (a destination a later step of the same plan did not keep)."""
        self.free_gpus[self.index_of[node_pk]] += count
        self.free_indices[node_pk] = sorted(self.idle_indices(node_pk) + indices)

    def feasible(self, job: Job, checkpoint: Checkpoint | None = None) -> np.ndarray:
        """Nodes that could run ``job`` now (design §3 feasibility, P2's own mask): enough free GPUs, VRAM and
        capability, and able to restore ``checkpoint`` (capability at least the one it was taken on)."""
        return feasible_mask(self.free_gpus, self.vram_gb, self.capability, self.compatible(checkpoint),
                             gpus=job.gpu_count, vram_gb_needed=job.vram_gb_per_gpu,
                             min_capability=float(job.min_capability))

    def compatible(self, checkpoint: Checkpoint | None) -> np.ndarray | None:
        """A checkpoint taken on capability X is restorable on nodes with capability ≥ X (design §1)."""
        if checkpoint is None or checkpoint.compute_capability is None:
            return None
        return self.capability >= float(checkpoint.compute_capability)


def lending_windows(now: Any = None) -> tuple[dict[int, list[lending.Window]], set[int]]:
    """Every node's lending windows (design §9.13) as ``scheduler.windows`` takes them, and the nodes among them
    whose window's end is being drained (a window-end reclaim whose deadline is after ``now``); one statement."""
    now = now or timezone.now()
    closing = Exists(ReclaimEvent.objects.filter(node=OuterRef("node_id"), kind=ReclaimKind.WINDOW,
                                                 deadline_at__gt=now))
    out: dict[int, list[lending.Window]] = {}
    draining: set[int] = set()
    for node_id, day, start, end, ends in LendingWindow.objects.order_by().annotate(closing=closing).values_list(
            "node_id", "weekday", "start_time", "end_time", "closing"):
        out.setdefault(node_id, []).append((int(day), start.hour * 60 + start.minute, end.hour * 60 + end.minute))
        if ends:
            draining.add(node_id)
    return out, draining


DEFAULT_WINDOW_NOTICE_S = 600.0  # jobs start leaving ten minutes before a lending window ends


def window_notice_s() -> float:
    """How long before its lending window ends a node takes nothing new and its jobs start leaving (design §9.13,
    ``RECLAIMNET["WINDOW_NOTICE_S"]``)."""
    return float(getattr(settings, "RECLAIMNET", {}).get("WINDOW_NOTICE_S", DEFAULT_WINDOW_NOTICE_S))


def window_states(windows: dict[int, list[lending.Window]], closing: set[int], local: Any) -> dict[int, str]:
    """Per node with windows that keep it from taking work now (design §9.13): ``closed`` (outside every window at
    ``local``, campus local time, ``settings.TIME_ZONE``) or ``closing`` (its window ends within the window notice,
    or its end is being drained: ``closing`` from :func:`lending_windows`). Nodes absent are lendable."""
    weekday, minute = lending.local_clock(local)
    notice_s = window_notice_s()
    out: dict[int, str] = {}
    for pk, ws in windows.items():
        left = lending.closes_in_s(ws, weekday, minute)
        if left is not None and left <= 0:
            out[pk] = "closed"
        elif pk in closing or (left is not None and left <= notice_s):
            out[pk] = "closing"
    return out


def load(now: Any = None) -> Campus:
    """Snapshot the tree, link bandwidths (B⁻) and GPU availability in a fixed number of queries.

    Only nodes whose access link was in the link read are kept: a node registered between the two queries
    (READ COMMITTED sees it in the second) would otherwise hang off a link the tree does not have.
    """
    now = now or timezone.now()
    local = timezone.localtime(now)
    links = list(Link.objects.order_by("pk").values_list("pk", "name", "upper__name", "lower_switch__name",
                                                          "node__pk", "capacity_bytes_per_s"))
    link_pks = [row[0] for row in links]
    link_index = {pk: i for i, pk in enumerate(link_pks)}
    nodes = [row for row in Node.objects.filter(access_link__isnull=False).order_by("pk").values_list(
        "pk", "building_id", "provider_id", "state", "killswitch_engaged", "gpu_floor", "access_link_id")
        if row[6] in link_index]
    node_pks = [row[0] for row in nodes]
    index_of = {pk: i for i, pk in enumerate(node_pks)}
    ends_b = [f"switch:{lower}" if lower is not None else
              (node_vertex(node_pk) if node_pk in index_of else f"dangling:{pk}")
              for pk, _, _, lower, node_pk, _ in links]
    tree = CampusTree.from_links([str(pk) for pk in link_pks], [f"switch:{row[2]}" for row in links], ends_b,
                                 [node_vertex(pk) for pk in node_pks])
    capacity = np.array([row[5] for row in links], dtype=float)
    lower = dict(LinkEstimate.objects.values_list("link_id", "lower_bytes_per_s"))
    available = np.array([link_available_bytes_per_s(row[5], lower.get(row[0])) for row in links], dtype=float)
    hardware = {node_id: (int(n), float(vram), float(cc)) for node_id, n, vram, cc in
                Gpu.objects.values("node_id").annotate(n=Count("pk"), vram=Min("vram_gb"),
                                                       cc=Min("compute_capability"))
                .values_list("node_id", "n", "vram", "cc")}
    live = live_node_pks()
    held, reserved = held_and_reserved_gpus()
    windows, closing = lending_windows(now)
    window_state = window_states(windows, closing, local)
    n = len(nodes)
    free = np.zeros(n)
    vram_gb = np.zeros(n)
    capability = np.zeros(n)
    for i, (pk, _, _, state, killswitch, floor, _) in enumerate(nodes):
        count, vram_gb[i], capability[i] = hardware.get(pk, (0, 0.0, 0.0))
        if state == NodeState.ONLINE and not killswitch and pk in live and pk not in window_state:
            free[i] = max(0, Node.lendable_of(count, floor) - held.get(pk, 0) - reserved.get(pk, 0))
    return Campus(
        tree=tree, node_pks=node_pks, index_of=index_of, link_pks=link_pks, link_names=[row[1] for row in links],
        link_capacity_bytes_per_s=capacity, link_available_bytes_per_s=available,
        building=np.array([row[1] for row in nodes], dtype=np.int64), provider_of={row[0]: row[2] for row in nodes},
        access_link_of={row[0]: link_index[row[6]] for row in nodes},
        free_gpus=free, vram_gb=vram_gb, capability=capability,
        now_hour=local.hour + local.minute / 60.0, live=live, windows=windows, window_state=window_state,
    )


def topology() -> dict[str, list[dict[str, Any]]]:
    """The campus tree and its nodes in the design §5 p2 request shape (ids are names), from the snapshot P2
    itself reads: ``links`` ``{"id", "a", "b", "bytes_per_s"}`` (``a`` nearer the core, ``bytes_per_s`` = B⁻);
    ``nodes`` (not retired) ``{"id", "building", "free_gpus", "vram_gb", "capability",
    "hazard_per_s_by_hour"}`` with ``free_gpus`` as P2 sees them (0 unless lent with a live agent)."""
    snap = load()
    links = []
    for pk, name, upper, lower_switch, node_name in Link.objects.order_by("name").values_list(
            "pk", "name", "upper__name", "lower_switch__name", "node__name"):
        lower = lower_switch or node_name
        if lower is None:
            continue  # an access link whose node was deleted: not part of the tree
        i = snap.link_pks.index(pk)
        links.append({"id": name, "a": upper, "b": lower, "bytes_per_s": float(snap.link_available_bytes_per_s[i])})
    hazard = snap.hazard_per_s_by_hour
    nodes = []
    for pk, name, building in Node.objects.exclude(state=NodeState.RETIRED).order_by("name").values_list(
            "pk", "name", "building__name"):
        i = snap.index_of.get(pk)
        if i is None:
            continue
        nodes.append({"id": name, "building": building, "free_gpus": int(snap.free_gpus[i]),
                      "vram_gb": float(snap.vram_gb[i]), "capability": float(snap.capability[i]),
                      "hazard_per_s_by_hour": [float(h) for h in hazard[i]]})
    return {"links": links, "nodes": nodes}
