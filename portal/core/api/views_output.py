"""``/api/jobs/{id}/output/``: the tail of a job's stdout+stderr, and following it with ``since`` (design §9.11).

Visible as the job is (its research group, admins); anybody else gets 404. Following is cheap: a reader sends
the ``next_offset`` of its previous answer as ``since``; when nothing was written meanwhile the answer costs one
read of the job's row (with its output head), otherwise one more indexed range read of the new chunks.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core import permissions
from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models.output import OUTPUT_CAP_BYTES, read_output

MAX_OFFSET = 2**63 - 1


class JobOutputQuerySerializer(serializers.Serializer):
    since = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=MAX_OFFSET,
        help_text="Byte offset to read from: 0 for everything kept, or the previous answer's next_offset to "
                  "follow. It may not be beyond the output's end.")


class JobOutputSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="The output from ``offset`` to ``next_offset`` (UTF-8; escape "
                                           "sequences and control characters removed, newlines and tabs kept).")
    offset = serializers.IntegerField(help_text="Byte offset of the first byte of ``text``.")
    next_offset = serializers.IntegerField(help_text="Byte offset after ``text``: send it as ``since`` to follow.")
    truncated = serializers.IntegerField(help_text="Bytes between ``since`` and ``offset`` that were dropped (the "
                                                   "output is capped at ``size_cap_bytes``; the oldest goes first).")
    running = serializers.BooleanField(help_text="The job has not ended: more output may follow.")
    size_cap_bytes = serializers.IntegerField(help_text="How much of the output the portal keeps per job.")


class JobOutputView(APIView):
    """A job's output: the last ``size_cap_bytes`` of its stdout and stderr over all its runs, a marker line
    where each run starts, kept after the job ends."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="jobs_output_retrieve",
        tags=["jobs"],
        parameters=[JobOutputQuerySerializer],
        responses=JobOutputSerializer,
        examples=[OpenApiExample("following", response_only=True, value={
            "text": "step 4300 loss 0.412\n", "offset": 18230, "next_offset": 18251, "truncated": 0,
            "running": True, "size_cap_bytes": OUTPUT_CAP_BYTES})],
    )
    def get(self, request: Request, id: int) -> Response:  # ``id``: the path parameter, named as the router names it
        query = JobOutputQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        since = query.validated_data["since"]
        row = (permissions.visible_jobs(request.user).filter(pk=id)
               .values("state", "output__start_offset", "output__end_offset").first())
        if row is None:
            raise NotFound()
        start, end = row["output__start_offset"] or 0, row["output__end_offset"] or 0
        if since > end:
            raise serializers.ValidationError({"since": [
                f"Beyond the end of the output ({end} bytes so far): send 0, or the next_offset of an earlier "
                "answer."]})
        offset, text = read_output(id, since, start, end)
        return Response({"text": text, "offset": offset, "next_offset": end, "truncated": max(0, offset - since),
                         "running": row["state"] not in TERMINAL, "size_cap_bytes": OUTPUT_CAP_BYTES})
