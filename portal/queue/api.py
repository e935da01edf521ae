"""``/api/arrays/``: an array and its jobs, cancel every live task (design §16.6). Researchers see only their
groups' arrays (others 404), admins all."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from portal.core import permissions
from portal.core.api.mixins import ServiceErrorsMixin
from portal.core.lifecycle.jobs import END_HOOKS, TERMINAL, JobState
from portal.core.models import AuditLog, Job, Placement, ResearchGroup
from portal.core.services import jobs as job_services
from portal.queue import dependencies
from portal.queue.models import ArrayTask, JobArray


class ArrayJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    array_index = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()


class JobArraySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    spec = serializers.CharField(help_text='As submitted, e.g. "0-49%8".')
    size = serializers.IntegerField()
    throttle = serializers.IntegerField(allow_null=True, help_text="Tasks running at once at most; null: no limit.")
    group = serializers.IntegerField()
    submitted_at = serializers.DateTimeField()
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="Jobs by state.")
    jobs = ArrayJobSerializer(many=True)


def array_jobs(arr: JobArray) -> list[dict[str, Any]]:
    """The array's jobs in index order (one statement)."""
    return [{"id": pk, "array_index": index, "name": name, "state": state} for pk, index, name, state in
            ArrayTask.objects.filter(array=arr).order_by("index").values_list("job_id", "index", "job__name",
                                                                               "job__state")]


def array_answer(arr: JobArray) -> dict[str, Any]:
    jobs = array_jobs(arr)
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    return {"id": arr.pk, "name": arr.name, "spec": arr.spec, "size": arr.size, "throttle": arr.throttle,
            "group": arr.group_id, "submitted_at": serializers.DateTimeField().to_representation(arr.submitted_at),
            "counts": counts, "jobs": jobs}


def array_submitted(arr: JobArray) -> dict[str, Any]:
    """What ``POST /api/jobs/`` answers for an array (the contract in /api/jobs/)."""
    jobs = array_jobs(arr)
    return {"array": {"id": arr.pk, "name": arr.name, "spec": arr.spec, "size": arr.size, "throttle": arr.throttle,
                      "group": arr.group_id}, "jobs": jobs}


def visible_arrays(user: Any) -> QuerySet[JobArray]:
    if permissions.is_admin(user):
        return JobArray.objects.all()
    return JobArray.objects.filter(group__in=ResearchGroup.objects.filter(members=user))


def cancel_array(arr: JobArray, actor: Any) -> int:
    """Cancel every live task of ``arr`` (one transaction); how many were cancelled.

    Tasks holding or taking GPUs (running, migrating, starting) go through ``cancel_job`` one by one (their node
    must be told to stop them); the queued rest — most of a big array — in one UPDATE, their ``after_ok``
    dependants in one cascade, and the array's people get ONE ``array.finished`` notice (design §16.6)."""
    with transaction.atomic():
        live = Job.objects.filter(array_task__array=arr).exclude(state__in=TERMINAL)
        idle = list(live.select_for_update(of=("self",)).filter(state=JobState.QUEUED)
                    .filter(~Exists(Placement.objects.filter(job=OuterRef("pk"), ended_at__isnull=True)))
                    .order_by("pk"))
        if idle and actor is not None and not permissions.can_cancel_job(actor, idle[0]):
            raise PermissionDenied("Only members of the array's research group (or an admin) may cancel it.")
        busy = list(live.exclude(pk__in=[j.pk for j in idle]).order_by("pk"))
        for job in busy:
            job_services.cancel_job(job, actor)
        now = timezone.now()
        Job.objects.filter(pk__in=[j.pk for j in idle]).update(state=JobState.CANCELLED, finished_at=now)
        for job in idle:  # locked above, so each one was still queued
            job.state, job.finished_at = JobState.CANCELLED, now
        cancelled = idle
        AuditLog.objects.bulk_create([AuditLog(actor=actor if getattr(actor, "is_authenticated", False) else None,
                                               action="job.cancel", object_type="job", object_id=str(j.pk))
                                      for j in cancelled])
        for job in cancelled:  # what the lifecycle would have called for each (the queue's own hook: below)
            for hook in END_HOOKS:
                if hook is not dependencies.job_ended:
                    hook(job)
        dependencies.cascade(dependencies.next_level(cancelled))
        if cancelled:
            dependencies.announce_if_ended(arr.pk)
    return len(busy) + len(idle)


class JobArrayViewSet(ServiceErrorsMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """An array with its jobs' states; ``cancel`` cancels every task still live."""

    permission_classes = [IsAuthenticated]
    serializer_class = JobArraySerializer
    transition_actions = frozenset({"cancel"})

    def get_queryset(self) -> QuerySet[JobArray]:
        if getattr(self, "swagger_fake_view", False):  # the schema generator, with no user
            return JobArray.objects.none()
        return visible_arrays(self.request.user)

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        return Response(array_answer(self.get_object()))

    @extend_schema(request=None, responses=JobArraySerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Safe to retry as it is: a second cancel finds no live task and answers the same array."""
        arr = self.get_object()
        cancel_array(arr, request.user)
        return Response(array_answer(arr))
