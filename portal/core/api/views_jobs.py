"""``/api/jobs/``: submit, list, detail, cancel, checkpoints and migrations (design §1 jobs)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from portal.core import permissions
from portal.core.api import rows
from portal.core.api import serializers as s
from portal.core.api.idempotency import idempotent
from portal.core.api.mixins import RowListMixin, ServiceErrorsMixin
from portal.core.models import Job, ResearchGroup
from portal.core.services import jobs as job_services


def _default_group(user: Any) -> ResearchGroup:
    groups = list(ResearchGroup.objects.filter(members=user)[:2])
    if len(groups) != 1:
        raise serializers.ValidationError({"group": ["Name the research group to charge this job to."]})
    return groups[0]


@extend_schema_view(list=extend_schema(parameters=[s.JobListQuerySerializer]))
class JobViewSet(ServiceErrorsMixin, RowListMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """A researcher sees and cancels only their group's jobs; anybody else gets 404 for them."""

    serializer_class = s.JobSerializer
    # JSON only: the bodies nest lists of objects that form encodings cannot carry (other types answer 415).
    parser_classes = [JSONParser]
    permission_classes = [IsAuthenticated, permissions.CanCancelJob]
    # Actions that move the job's lifecycle: a refused or raced transition answers 409 (the schema says so).
    transition_actions = frozenset({"cancel"})

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        """The detail adds ``waiting_reason`` (computed on read: the list stays as cheap as it was)."""
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        queryset = (
            permissions.visible_jobs(self.request.user)
            .select_related("owner", "group")
            .prefetch_related("placements__node")
        )
        if self.action == "list":
            query = s.JobListQuerySerializer(data=self.request.query_params.dict())
            query.is_valid(raise_exception=True)
            filters = query.validated_data
            if "state" in filters:
                queryset = queryset.filter(state=filters["state"])
            if "group" in filters:
                queryset = queryset.filter(group_id=filters["group"])
        return queryset

    @extend_schema(request=s.JobSubmitSerializer, responses={201: s.JobSerializer})
    @idempotent
    def create(self, request: Request) -> Response:
        """Submit a job; it is charged to ``group`` and queued for placement."""
        user = request.user
        if not (permissions.is_admin(user) or permissions.is_researcher(user)):
            raise PermissionDenied("Only research group members (or admins) submit jobs.")
        serializer = s.JobSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        group = data.pop("group", None) or _default_group(user)
        if not permissions.can_submit_to_group(user, group):
            raise PermissionDenied("You may only submit jobs for a research group you belong to.")
        job = job_services.submit_job(user, group=group, **data)
        # JobSerializer's answer, from plain rows (portal/core/api/rows.py, design §10).
        answer = rows.job_rows(list(rows.JOB_PLAN.values(self.get_queryset().filter(pk=job.pk))))[0]
        return Response(answer, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = job_services.cancel_job(self.get_object(), request.user)
        return Response(s.JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(responses=s.CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        rows = job.checkpoints.prefetch_related("replica_nodes").order_by("sequence")
        return Response(s.CheckpointSerializer(rows, many=True).data)

    @extend_schema(responses=s.MigrationSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def migrations(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        rows = job.migrations.select_related("source", "destination").order_by("started_at", "pk")
        return Response(s.MigrationSerializer(rows, many=True).data)

    @extend_schema(responses=s.PlacementSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def placements(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        rows = job.placements.select_related("node").order_by("started_at", "pk")
        return Response(s.PlacementSerializer(rows, many=True).data)
