"""``/api/whatif/evaluations/``: list, start, read and download what-if evaluations (design §7 "The what-if
report"). Staff only: any other signed-in user answers 403. A refused start answers 400
``{"field": …, "detail": …}`` (and ``file``: the zip member concerned)."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from portal.core.permissions import is_admin
from portal.whatif import services
from portal.whatif.models import Evaluation, EvaluationState, TraceSource
from portal.whatif.upload import UploadError
from scheduler.sim.whatif import to_csv

FIELD_ERROR = inline_serializer("WhatifFieldError", {
    "field": serializers.CharField(help_text="What was refused: body, source, days, policies, seeds, trace or a "
                                             "trace column such as jobs.work_s."),
    "detail": serializers.CharField(),
    "file": serializers.CharField(required=False, help_text="The uploaded file or zip member concerned."),
})

NOT_DONE = inline_serializer("WhatifNotDone", {"detail": serializers.CharField()})


class IsStaff(permissions.BasePermission):
    message = "What-if evaluations are for campus admins."

    def has_permission(self, request: Request, view: Any) -> bool:
        return is_admin(request.user)


class EvaluationSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    source_label = serializers.CharField(read_only=True)

    class Meta:
        model = Evaluation
        fields = ["id", "created_by", "created_at", "started_at", "finished_at", "source", "source_label",
                  "history_days", "trace_name", "policies", "seeds", "state", "progress", "progress_label", "error"]
        read_only_fields = fields


class EvaluationDetailSerializer(EvaluationSerializer):
    report = serializers.JSONField(read_only=True, allow_null=True,
                                   help_text="scheduler.sim.whatif.compare's report once done: table, runs, "
                                             "classes, pareto.")

    class Meta(EvaluationSerializer.Meta):
        fields = [*EvaluationSerializer.Meta.fields, "report"]
        read_only_fields = fields


class EvaluationCreateSerializer(serializers.Serializer):
    """What a start takes (multipart for an upload, or JSON for the portal's history)."""

    source = serializers.ChoiceField(choices=TraceSource.choices)
    days = serializers.IntegerField(required=False, min_value=1, max_value=366,
                                    help_text="source=history: the last N days (default 30).")
    policies = serializers.ListField(child=serializers.CharField(), help_text="Simulator policy names "
                                     "(scheduler.sim.policies), e.g. reclaimnet, static, slurm-pr.")
    seeds = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False,
                                  help_text="Simulator seeds (default [0]).")
    trace = serializers.FileField(required=False, help_text="source=upload: a design §7 JSON file or a zip of "
                                                             "the CSV folder.")


def _list(data: Any, name: str) -> Any:
    if hasattr(data, "getlist"):
        values = data.getlist(name)
        return values[0] if len(values) == 1 else values
    return data.get(name)


class EvaluationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """What-if evaluations: the simulator's policies replayed on the portal's history or an uploaded trace."""

    permission_classes = [permissions.IsAuthenticated, IsStaff]
    reads_need_role = True  # the schema documents 403 on its reads too (portal/core/api/schema.py)
    parser_classes = [JSONParser, MultiPartParser, FormParser]
    queryset = Evaluation.objects.none()  # the schema's path types; get_queryset reads the table

    def get_queryset(self) -> QuerySet[Evaluation]:
        qs = Evaluation.objects.select_related("created_by").order_by("-created_at", "-id")
        return qs.defer("trace_gz", "report") if self.action == "list" else qs.defer("trace_gz")

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return EvaluationSerializer if self.action == "list" else EvaluationDetailSerializer

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.expire_stale()
        return super().list(request, *args, **kwargs)

    @extend_schema(request={"multipart/form-data": EvaluationCreateSerializer,
                            "application/json": EvaluationCreateSerializer},
                   responses={201: EvaluationSerializer, 400: FIELD_ERROR})
    def create(self, request: Request) -> Response:
        """Start an evaluation; it runs on the ``evaluation`` queue. Follow ``progress`` with GET."""
        try:
            data = request.data
        except exceptions.ParseError as e:  # a body its content type does not parse: 400 naming it, as documented
            return Response({"field": "body", "detail": str(e.detail)}, status=status.HTTP_400_BAD_REQUEST)
        if not hasattr(data, "get"):
            return Response({"field": "source", "detail": "send an object (JSON) or a form"},
                            status=status.HTTP_400_BAD_REQUEST)
        upload = None
        file = request.FILES.get("trace") if hasattr(request, "FILES") else None
        if file is not None:
            limit, _ = services.upload_limits()
            if file.size is not None and file.size > limit:
                return Response({"field": "trace", "detail": f"{file.size} bytes; at most {limit}",
                                 "file": file.name}, status=status.HTTP_400_BAD_REQUEST)
            upload = (file.name or "trace", file.read(limit + 1))
        try:
            ev = services.create_evaluation(
                request.user, policies=services.parse_policies(_list(data, "policies")),
                seeds=services.parse_seeds(_list(data, "seeds") if data.get("seeds") not in (None, "") else [0]),
                source=str(data.get("source") or ""), days=data.get("days"), upload=upload)
        except UploadError as e:
            return Response(e.as_dict(), status=status.HTTP_400_BAD_REQUEST)
        return Response(EvaluationSerializer(ev).data, status=status.HTTP_201_CREATED)

    def _done(self) -> Evaluation | Response:
        ev = self.get_object()
        if ev.state != EvaluationState.DONE or ev.report is None:
            return Response({"detail": f"The evaluation is {ev.state}; its report exists once it is done."},
                            status=status.HTTP_409_CONFLICT)
        return ev

    @extend_schema(responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The report as a download."),
                              409: OpenApiResponse(NOT_DONE, description="Not done yet.")})
    @action(detail=True, methods=["get"], url_path="report")
    def report_json(self, request: Request, pk: str | None = None) -> Any:
        ev = self._done()
        if isinstance(ev, Response):
            return ev
        response = HttpResponse(json.dumps(ev.report, indent=1), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="whatif-{ev.pk}.json"'
        return response

    @extend_schema(parameters=[OpenApiParameter("table", OpenApiTypes.STR, enum=["table", "runs", "classes"],
                                                description="Which table (default: the per-policy table).")],
                   responses={200: OpenApiResponse(OpenApiTypes.STR, description="CSV text."),
                              400: FIELD_ERROR, 409: OpenApiResponse(NOT_DONE, description="Not done yet.")})
    @action(detail=True, methods=["get"], url_path="report-csv")
    def report_csv(self, request: Request, pk: str | None = None) -> Any:
        table = request.query_params.get("table", "table")
        if table not in ("table", "runs", "classes"):
            return Response({"field": "table", "detail": "one of table, runs, classes"},
                            status=status.HTTP_400_BAD_REQUEST)
        ev = self._done()
        if isinstance(ev, Response):
            return ev
        response = HttpResponse(to_csv(ev.report, table), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="whatif-{ev.pk}-{table}.csv"'
        return response
