"""The hot API reads as plain rows: the serializers' own JSON, built from ``.values()`` (docs/design.md §10).

A list of 54 nodes through ``NodeSerializer`` built about 300 model instances (nodes, GPUs, windows, their
buildings, labs and links), each with its related managers, then walked every field of every instance through
DRF's generic attribute lookup: about 35 ms of CPU for ``GET /api/nodes/``, the read ``make load`` sends most.
Here each serializer's fields are read once per process (:class:`RowPlan`) and every row is converted with the
very field objects the serializer would use (``DateTimeField.to_representation``, ``DecimalField``'s
quantizing, choices), from plain ``.values()`` dictionaries: the same keys in the same order, the same values.
``tests/portal/test_api_rows.py`` compares the two on every node, job and reclaim of a campus.

The serializers stay the API's description (the schema is generated from them) and the path for everything
else: writes, and the answers to them.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db.models import Model, QuerySet
from rest_framework import serializers

from portal.core.api import serializers as s
from portal.core.models import Gpu, LendingWindow, Node, Placement

Row = dict[str, Any]


def _identity(value: Any) -> Any:
    return value


class RowPlan:
    """How each field of ``serializer_class`` comes out of a ``.values()`` row of its model.

    Plain model fields and ``source="relation.field"`` lookups are read from the row and converted by the
    serializer's own field; a primary-key relation is its id, a slug relation its slug. Anything else (nested
    serializers, method fields, properties) must be given in ``computed``: ``{field name: function of the row}``.
    """

    def __init__(self, serializer_class: type[serializers.ModelSerializer],
                 computed: dict[str, Callable[[Row], Any]] | None = None) -> None:
        self.serializer_class = serializer_class
        self.computed = computed or {}
        self._columns: list[tuple[str, str | None, Callable[[Any], Any]]] | None = None
        self._lock = threading.Lock()

    @property
    def columns(self) -> list[tuple[str, str | None, Callable[[Any], Any]]]:
        """(output name, ``.values()`` key or None for a computed field, converter), in the serializer's order."""
        if self._columns is None:
            with self._lock:
                if self._columns is None:
                    self._columns = self._plan()
        return self._columns

    def _plan(self) -> list[tuple[str, str | None, Callable[[Any], Any]]]:
        model = self.serializer_class.Meta.model
        plan: list[tuple[str, str | None, Callable[[Any], Any]]] = []
        for name, field in self.serializer_class().fields.items():
            if field.write_only:
                continue
            if name in self.computed:
                plan.append((name, None, self.computed[name]))
                continue
            source = field.source
            try:
                model._meta.get_field(source.split(".")[0])
            except FieldDoesNotExist:
                raise TypeError(f"{self.serializer_class.__name__}.{name}: give it in computed") from None
            key = source.replace(".", "__")
            if isinstance(field, serializers.PrimaryKeyRelatedField):
                plan.append((name, key, _identity))
            elif isinstance(field, serializers.SlugRelatedField):
                plan.append((name, f"{key}__{field.slug_field}", _identity))
            elif isinstance(field, serializers.RelatedField | serializers.ManyRelatedField |
                            serializers.BaseSerializer | serializers.SerializerMethodField):
                raise TypeError(f"{self.serializer_class.__name__}.{name}: give it in computed")
            else:
                plan.append((name, key, field.to_representation))
        return plan

    def keys(self) -> list[str]:
        """What to ask ``.values()`` for."""
        return [key for _, key, _ in self.columns if key is not None]

    def row(self, values: Row) -> Row:
        """The serializer's representation of the instance ``values`` was read from."""
        out: Row = {}
        for name, key, convert in self.columns:
            if key is None:
                out[name] = convert(values)
            else:
                value = values[key]
                out[name] = None if value is None else convert(value)
        return out

    def values(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """``queryset`` as the rows this plan reads (its prefetches dropped: the rows bring their own)."""
        return queryset.prefetch_related(None).values(*self.keys())


def instance(model: type[Model], values: Row, db: str) -> Model:
    """A ``model`` instance for a row read by a plan (object permission checks): the concrete fields the row holds
    as read, every other field deferred (loaded from the database if something reads it)."""
    names, known = [], []
    for f in model._meta.concrete_fields:
        for key in (f.name, f.attname):
            if key in values:
                names.append(f.attname)
                known.append(values[key])
                break
    return model.from_db(db, names, known)


def _children(plan: RowPlan, queryset: QuerySet[Any], parent_key: str, parent_ids: Iterable[int],
              order_by: Iterable[str]) -> dict[int, list[Row]]:
    """{parent id: [child rows in ``order_by`` order]} for a nested ``many=True`` serializer."""
    ids = list(parent_ids)
    grouped: dict[int, list[Row]] = defaultdict(list)
    if not ids:
        return grouped
    rows = queryset.filter(**{f"{parent_key}__in": ids}).order_by(parent_key, *order_by) \
        .values(parent_key, *plan.keys())
    for values in rows:
        grouped[values[parent_key]].append(plan.row(values))
    return grouped


# --- campus and accounts ----------------------------------------------------------------------------------------------------

BUILDING_PLAN = RowPlan(s.BuildingSerializer)
SWITCH_PLAN = RowPlan(s.SwitchSerializer)
PROVIDER_PLAN = RowPlan(s.ProviderSerializer)
GROUP_PLAN = RowPlan(s.ResearchGroupSerializer)


# --- nodes -------------------------------------------------------------------------------------------------------

GPU_PLAN = RowPlan(s.GpuSerializer)
WINDOW_PLAN = RowPlan(s.LendingWindowSerializer)
NODE_PLAN = RowPlan(s.NodeSerializer, computed={
    "gpus": lambda row: row["_gpus"],
    "lendable_gpu_count": lambda row: Node.lendable_of(len(row["_gpus"]), row["gpu_floor"]),
    "lending_windows": lambda row: row["_windows"],
})


def node_rows(values: list[Row]) -> list[Row]:
    """``NodeSerializer(nodes, many=True).data`` for the nodes read as ``NODE_PLAN.values(...)`` rows."""
    ids = [row["id"] for row in values]
    gpus = _children(GPU_PLAN, Gpu.objects.all(), "node_id", ids, ["index"])
    windows = _children(WINDOW_PLAN, LendingWindow.objects.all(), "node_id", ids, ["weekday", "start_time"])
    out = []
    for row in values:
        row["_gpus"], row["_windows"] = gpus.get(row["id"], []), windows.get(row["id"], [])
        out.append(NODE_PLAN.row(row))
    return out


# --- jobs --------------------------------------------------------------------------------------------------------

JOB_PLAN = RowPlan(s.JobSerializer, computed={"node": lambda row: row["_node"]})


def job_rows(values: list[Row]) -> list[Row]:
    """``JobSerializer(jobs, many=True).data`` for the jobs read as ``JOB_PLAN.values(...)`` rows: ``node`` is
    the node of the job's open placement (there is at most one), else None."""
    ids = [row["id"] for row in values]
    running = dict(Placement.objects.filter(job_id__in=ids, ended_at__isnull=True).order_by()
                   .values_list("job_id", "node__name")) if ids else {}
    out = []
    for row in values:
        row["_node"] = running.get(row["id"])
        out.append(JOB_PLAN.row(row))
    return out


# --- reclaims ----------------------------------------------------------------------------------------------------

RECLAIM_PLAN = RowPlan(s.ReclaimEventSerializer)


def reclaim_rows(values: list[Row]) -> list[Row]:
    """``ReclaimEventSerializer(reclaims, many=True).data`` for ``RECLAIM_PLAN.values(...)`` rows."""
    return [RECLAIM_PLAN.row(row) for row in values]


# serializer class -> (its plan, rows of many); RowListMixin answers a list whose serializer is listed here.
PLANS: dict[type[Any], tuple[RowPlan, Callable[[list[Row]], list[Row]]]] = {
    s.NodeSerializer: (NODE_PLAN, node_rows),
    s.JobSerializer: (JOB_PLAN, job_rows),
    s.ReclaimEventSerializer: (RECLAIM_PLAN, reclaim_rows),
}
