"""Campus topology, reclaims, the summary, the caller's identity and the what-if decision endpoints."""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core import permissions, snapshots
from portal.core.api import serializers as s
from portal.core.api.mixins import RowListMixin, ServiceErrorsMixin
from portal.core.api.rows import BUILDING_PLAN, GROUP_PLAN, PROVIDER_PLAN, SWITCH_PLAN
from portal.core.campus import topology as campus_topology
from portal.core.models import Building, Link, Provider, ReclaimEvent, ResearchGroup, Switch
from portal.core.services.summary import shared_utilization_summary


@extend_schema(exclude=True)
class ApiNotFoundView(APIView):
    """Any other ``/api/…/`` path (an id that is not a number, an unknown route): after authentication, a JSON
    404 as the schema documents for detail routes, instead of Django's HTML page. (A path without its trailing
    slash still gets APPEND_SLASH's redirect: this view only matches paths ending in "/".)"""

    def http_method_not_allowed(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raise NotFound()

    def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raise NotFound()


class BuildingViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Building.objects.order_by("name")
    serializer_class = s.BuildingSerializer


class SwitchViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Switch.objects.order_by("name")
    serializer_class = s.SwitchSerializer


class LinkViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Link.objects.select_related("lower_switch", "node").order_by("name")
    serializer_class = s.LinkSerializer


class ProviderViewSet(viewsets.ReadOnlyModelViewSet):
    """Provider labs (all visible: nodes name their lab)."""

    queryset = Provider.objects.order_by("name")
    serializer_class = s.ProviderSerializer


class ResearchGroupViewSet(viewsets.ReadOnlyModelViewSet):
    """The caller's research groups (admins: all), with their GPU-hour accounting."""

    serializer_class = s.ResearchGroupSerializer

    def get_queryset(self) -> QuerySet[ResearchGroup]:
        return permissions.user_groups(self.request.user).order_by("name")


@extend_schema_view(list=extend_schema(parameters=[s.ReclaimListQuerySerializer]))
class ReclaimViewSet(RowListMixin, viewsets.ReadOnlyModelViewSet):
    """Reclaims of the caller's lab's nodes and of nodes their group's jobs were moved off (admins: all)."""

    serializer_class = s.ReclaimEventSerializer

    def get_queryset(self) -> QuerySet[ReclaimEvent]:
        queryset = permissions.visible_reclaims(self.request.user).select_related("node", "requested_by")
        if self.action == "list":
            query = s.ReclaimListQuerySerializer(data=self.request.query_params.dict())
            query.is_valid(raise_exception=True)
            filters = query.validated_data
            if "node" in filters:
                queryset = queryset.filter(node_id=filters["node"])
            if "kind" in filters:
                queryset = queryset.filter(kind=filters["kind"])
        return queryset.order_by("-requested_at", "-pk")


TOPOLOGY_KEY = "reclaimnet:topology:v1"


def _topology() -> dict[str, Any]:
    return {
        "buildings": [BUILDING_PLAN.row(v) for v in BUILDING_PLAN.values(Building.objects.order_by("name"))],
        "switches": [SWITCH_PLAN.row(v) for v in SWITCH_PLAN.values(Switch.objects.order_by("name"))],
        **campus_topology(),
    }


class TopologyView(APIView):
    """The campus tree: buildings, switches, and links/nodes in the design §5 p2 shape (ids are names).
    The same for every caller: one snapshot at most 5 s old, shared by the deployment (design §9.1)."""

    @extend_schema(responses=s.TopologySerializer)
    def get(self, request: Request) -> Response:
        return Response(snapshots.shared(TOPOLOGY_KEY, _topology))


class SummaryView(APIView):
    """Campus utilization and reclaim summary (design §6 metrics). One snapshot at most 5 s old, shared by the
    deployment: /metrics reports the same one (design §9.1)."""

    @extend_schema(responses=s.SummarySerializer)
    def get(self, request: Request) -> Response:
        return Response(shared_utilization_summary())


class MeView(APIView):
    """Who the caller is and which roles they hold."""

    @extend_schema(responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        user = request.user
        providers = [PROVIDER_PLAN.row(v) for v in PROVIDER_PLAN.values(Provider.objects.filter(members=user))]
        groups = [GROUP_PLAN.row(v) for v in GROUP_PLAN.values(ResearchGroup.objects.filter(members=user))]
        # permissions.roles(user), from the memberships just read instead of two more queries: a member of a
        # lab is a provider, of a group a researcher (design §1).
        roles = (["admin"] if permissions.is_admin(user) else []) + (["provider"] if providers else []) + (
            ["researcher"] if groups else [])
        return Response(
            {
                "id": user.pk,
                "username": user.get_username(),
                "is_staff": bool(user.is_staff),
                "roles": roles,
                "providers": providers,
                "groups": groups,
            }
        )


_DECIDE_EXAMPLES = {
    "p1": {"budget_bytes_per_s": 50e6, "jobs": [{"id": "j1", "hazard_per_s": 2.7e-4, "ckpt_bytes": 3.2e9}]},
    "p2": {
        "source": "n1", "ckpt_bytes": 3.2e9, "notice_s": 60, "remaining_s": 3600,
        "links": [{"id": "l1", "a": "sw", "b": "n1", "bytes_per_s": 125e6},
                  {"id": "l2", "a": "sw", "b": "n2", "bytes_per_s": 125e6}],
        "nodes": [{"id": "n1", "building": "B1", "free_gpus": 0, "vram_gb": 24, "capability": 8.6,
                   "hazard_per_s_by_hour": [2.7e-4] * 24},
                  {"id": "n2", "building": "B1", "free_gpus": 1, "vram_gb": 24, "capability": 8.6,
                   "hazard_per_s_by_hour": [2.7e-4] * 24}],
    },
    "p3": {"capacity_bytes_per_s": 125e6, "flows": [{"id": "f1", "bytes": 3.2e9, "notice_s": 60, "restart_s": 5}]},
}


class DecideView(ServiceErrorsMixin, APIView):
    """What-if: run one P1/P2/P3 decision on a design §5 JSON request and return its JSON answer.

    Nothing is stored or enforced. Invalid input answers 400 ``{field: [message]}``.
    """

    kind: ClassVar[str] = "p1"
    parser_classes = [JSONParser]  # the design §5 requests are JSON documents

    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise serializers.ValidationError({"non_field_errors": ["A JSON object is required."]})
        contract = importlib.import_module("scheduler.contract")  # the scheduler is optional at import time
        try:
            answer: Any = contract.decide(self.kind, dict(request.data))
        except contract.ContractError as exc:
            field = getattr(exc, "field", None) or "non_field_errors"
            return Response({field: [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(answer)


def decide_view(kind: str) -> Any:
    """A DecideView bound to ``kind``, documented with its design §5 example."""

    # A fresh function per kind: extend_schema annotates the function object, so sharing one would leave
    # all three operations with the last kind's operation id.
    def post(self: DecideView, request: Request) -> Response:
        return DecideView.post(self, request)

    documented = extend_schema(
        operation_id=f"decide_{kind}",
        summary=f"What-if {kind.upper()} decision (design §5)",
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT},
        examples=[OpenApiExample(f"{kind} request", value=_DECIDE_EXAMPLES[kind], request_only=True)],
    )(post)
    view = type(f"Decide{kind.upper()}View", (DecideView,), {"kind": kind, "post": documented,
                                                             "__doc__": DecideView.__doc__})
    return view.as_view()
