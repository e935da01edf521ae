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

from portal.control.reclaim import evict
from portal.core import permissions
from portal.core.api import rows
from portal.core.api import serializers as s
from portal.core.api.idempotency import idempotent
from portal.core.api.mixins import RowListMixin, ServiceErrorsMixin
from portal.core.models import Job, ResearchGroup
from portal.core.services import jobs as job_services
from portal.queue import api as queue_api
from portal.queue import submit as queue_submit
from portal.queue.models import JobArray


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
    transition_actions = frozenset({"cancel", "resume"})

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
            if "array" in filters:  # one array's jobs (design §16.6)
                queryset = queryset.filter(array_task__array_id=filters["array"])
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
        group = data.pop("group", None)
        if group is None:
            group = _default_group(user)  # one of the user's own groups: no membership to check again
        elif not permissions.can_submit_to_group(user, group):
            raise PermissionDenied("You may only submit jobs for a research group you belong to.")
        queue_fields = {k: data.pop(k) for k in ("array", "after_ok", "after_any") if k in data}  # design §16.6
        job = queue_submit.submit_any(user, group=group, **data, **queue_fields)
        if isinstance(job, JobArray):  # an array: the array and its jobs (portal.queue.api)
            return Response(queue_api.array_submitted(job), status=status.HTTP_201_CREATED)
        # JobSerializer's answer, from plain rows (portal/core/api/rows.py, design §10); no node: a job is placed
        # only after its transaction commits.
        row = rows.JOB_PLAN.values(self.get_queryset().filter(pk=job.pk)).get()
        answer = rows.JOB_PLAN.row({**row, "_node": None})
        return Response(answer, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = job_services.cancel_job(self.get_object(), request.user)
        return Response(s.JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=None, responses=s.JobSerializer,
                   description="Resume a job the idle watchdog or the loan timer released (state `suspended`): it is "
                               "queued again and resumes from its checkpoint (design §15). Its owner or an admin.")
    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request: Request, pk: str | None = None) -> Response:
        job = evict.resume_job(self.get_object(), request.user)
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
