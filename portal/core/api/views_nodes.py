"""``/api/nodes/``: register, list, update, lending windows, reclaim actions, agent tokens (design §1)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from portal.control.reclaim.plan import preview as preview_reclaim
from portal.core import permissions
from portal.core.api import serializers as s
from portal.core.api.idempotency import idempotent
from portal.core.api.mixins import RowListMixin, ServiceErrorsMixin
from portal.core.models import Node, Provider
from portal.core.services import nodes as node_services
from portal.core.services import reclaims as reclaim_services


def _default_provider(user: Any) -> Provider:
    """The lab to register for when the request names none: the user's only lab."""
    labs = list(Provider.objects.filter(members=user)[:2])
    if len(labs) != 1:
        raise serializers.ValidationError({"provider": ["Name the provider lab lending this node."]})
    return labs[0]


@extend_schema_view(list=extend_schema(parameters=[s.NodeListQuerySerializer]))
class NodeViewSet(ServiceErrorsMixin, RowListMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Nodes are readable by every signed-in user; changes need the node's lab or an admin."""

    serializer_class = s.NodeSerializer
    # JSON only: the bodies nest lists of objects that form encodings cannot carry (other types answer 415).
    parser_classes = [JSONParser]
    permission_classes = [IsAuthenticated, permissions.CanManageNode]
    # Read-only actions that still reveal the lab's business (hosted jobs): manage permission required.
    manage_actions = frozenset({"reclaim_preview"})
    # Actions that move the node's lifecycle: a refused or raced transition answers 409 (the schema says so).
    transition_actions = frozenset({"reclaim", "emergency_reclaim", "killswitch", "lend_again"})

    def get_queryset(self) -> QuerySet[Node]:
        queryset = (
            permissions.visible_nodes(self.request.user)
            .select_related("provider", "building", "access_link")
            .prefetch_related("gpus", "lending_windows")
        )
        if self.action == "list":
            query = s.NodeListQuerySerializer(data=self.request.query_params.dict())
            query.is_valid(raise_exception=True)
            filters = query.validated_data
            if "state" in filters:
                queryset = queryset.filter(state=filters["state"])
            if "provider" in filters:
                queryset = queryset.filter(provider_id=filters["provider"])
            if "building" in filters:
                queryset = queryset.filter(building_id=filters["building"])
            if filters["mine"]:
                queryset = queryset.filter(provider__members=self.request.user)
        return queryset.order_by("name")

    def _reload(self, node: Node) -> Node:
        return self.get_queryset().get(pk=node.pk)

    @extend_schema(request=s.NodeRegisterSerializer, responses={201: s.NodeRegisteredSerializer})
    @idempotent
    def create(self, request: Request) -> Response:
        """Register a node; the response carries its agent token, shown this once only."""
        user = request.user
        if not (permissions.is_admin(user) or permissions.is_provider_member(user)):
            raise PermissionDenied("Only provider lab members (or admins) register nodes.")
        serializer = s.NodeRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        provider = data.pop("provider", None) or _default_provider(user)
        if not permissions.can_manage_provider(user, provider):
            raise PermissionDenied("You may only register nodes for a provider lab you belong to.")
        node, token = node_services.register_node(
            user,
            provider=provider,
            building=data["building"],
            name=data["name"],
            gpus=[dict(gpu) for gpu in data["gpus"]],
            gpu_floor=data["gpu_floor"],
            access_link_bytes_per_s=data["access_link_bytes_per_s"],
            lending_windows=[dict(window) for window in data.get("lending_windows", [])],
        )
        node = self._reload(node)
        node.agent_token = token  # type: ignore[attr-defined]
        return Response(s.NodeRegisteredSerializer(node).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.NodeUpdateSerializer, responses=s.NodeSerializer)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        node = self.get_object()
        serializer = s.NodeUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        node = node_services.update_node(node, request.user, **serializer.validated_data)
        return Response(s.NodeSerializer(self._reload(node)).data)

    @extend_schema(methods=["GET"], responses=s.LendingWindowListSerializer)
    @extend_schema(methods=["PUT"], request=s.LendingWindowListSerializer, responses=s.LendingWindowListSerializer)
    @action(detail=True, methods=["get", "put"], url_path="lending-windows")
    def lending_windows(self, request: Request, pk: str | None = None) -> Response:
        """The weekly lending windows; PUT replaces them all at once ([] = always lent)."""
        node = self.get_object()
        if request.method == "PUT":
            serializer = s.LendingWindowListSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            node_services.set_lending_windows(node, request.user, [dict(w) for w in serializer.validated_data["windows"]])
        windows = node.lending_windows.all().order_by("weekday", "start_time")
        return Response({"windows": s.LendingWindowSerializer(windows, many=True).data})

    @extend_schema(request=s.ReclaimRequestSerializer, responses={201: s.ReclaimEventSerializer})
    @action(detail=True, methods=["post"])
    @idempotent
    def reclaim(self, request: Request, pk: str | None = None) -> Response:
        """Take the node back with ``notice_s`` seconds of notice (0 = emergency)."""
        node = self.get_object()
        serializer = s.ReclaimRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        event = reclaim_services.request_reclaim(node, request.user, serializer.validated_data["notice_s"])
        return Response(s.ReclaimEventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: s.ReclaimEventSerializer})
    @action(detail=True, methods=["post"], url_path="emergency-reclaim")
    @idempotent
    def emergency_reclaim(self, request: Request, pk: str | None = None) -> Response:
        """Take the node back now (τ = 0); jobs resume from their freshest pre-synced checkpoint."""
        event = reclaim_services.emergency_reclaim(self.get_object(), request.user)
        return Response(s.ReclaimEventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: s.ReclaimEventSerializer})
    @action(detail=True, methods=["post"])
    @idempotent
    def killswitch(self, request: Request, pk: str | None = None) -> Response:
        """Stop the node taking new work at once (the agent drops new connections at its edge)."""
        event = reclaim_services.engage_killswitch(self.get_object(), request.user)
        return Response(s.ReclaimEventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="lend-again")
    @idempotent
    def lend_again(self, request: Request, pk: str | None = None) -> Response:
        node = node_services.lend_again(self.get_object(), request.user)
        return Response(s.NodeSerializer(self._reload(node)).data)

    @extend_schema(request=None, responses=s.AgentTokenSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request: Request, pk: str | None = None) -> Response:
        """A new agent token (shown once); the old one stops working at once."""
        node = self.get_object()
        token = node_services.rotate_agent_token(node, request.user)
        return Response({"agent_token": token, "agent_token_prefix": node.agent_token_prefix})

    @extend_schema(request=None, responses={204: OpenApiResponse(description="Revoked.")})
    @action(detail=True, methods=["post"], url_path="revoke-token")
    def revoke_token(self, request: Request, pk: str | None = None) -> Response:
        node_services.revoke_agent_token(self.get_object(), request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=[s.ReclaimPreviewQuerySerializer], responses=s.ReclaimPreviewSerializer)
    @action(detail=True, methods=["get"], url_path="reclaim-preview")
    def reclaim_preview(self, request: Request, pk: str | None = None) -> Response:
        """What reclaiming the node with this notice would do to each hosted job: the reclaim planner's own
        answer on the current state (design §9.2), and the shortest notice with which no job loses work."""
        node = self.get_object()
        query = s.ReclaimPreviewQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        return Response(preview_reclaim(node, query.validated_data["notice_s"]))
