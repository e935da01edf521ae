"""Job results over HTTP (design §14).

Researchers (DRF, in the schema): ``GET /api/jobs/{id}/results/`` lists the files the job's agent uploaded,
``GET /api/jobs/{id}/results/files/<path>`` and ``GET /api/jobs/{id}/checkpoint/`` send the bytes with their
sha256 in ``X-Checksum-SHA256``, streamed from an async iterator in bounded chunks. Readable by whoever sees
the job (``permissions.visible_jobs``: its group's members and admins); anybody else gets 404.

Agents (plain views, not in the researchers' schema; the node's agent token as ``Authorization: Bearer``, as
on the websocket): ``GET /api/agent/jobs/{id}/results/`` what is kept already, ``PUT
/api/agent/jobs/{id}/results/<files|checkpoint>/<path>`` one chunk of one file, ``POST
/api/agent/jobs/{id}/results/complete/`` the output directory's final list. The protocol is in
``portal/core/services/results.py``.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
from collections.abc import AsyncIterator, Iterator
from typing import Any, BinaryIO

from django.core.exceptions import ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.lifecycle.nodes import NodeState
from portal.core.models import ResultKind
from portal.core.services import results as svc
from portal.core.services.nodes import node_for_agent_token

CHECKSUM_HEADER = "X-Checksum-SHA256"
DOWNLOAD_CHUNK_BYTES = 1 << 20  # read from the storage in a thread, one chunk in memory at a time


class BinaryRenderer(BaseRenderer):
    """``application/octet-stream`` for the download endpoints (an error body is still JSON text)."""

    media_type = "application/octet-stream"
    format = "bin"
    charset = None
    render_style = "binary"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data if isinstance(data, bytes) else json.dumps(data).encode()


class ResultFileSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Relative to the job's output directory, '/'-separated.")
    size_bytes = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="Hex sha256 of the bytes, verified by the portal on upload.")
    download_url = serializers.CharField(help_text="Where to GET the bytes.")


class JobResultsSerializer(serializers.Serializer):
    files = ResultFileSerializer(many=True)
    total_bytes = serializers.IntegerField(help_text="Sum of the files' sizes (the final checkpoint not counted).")
    state = serializers.ChoiceField(choices=["none", "partial", "complete"], help_text=(
        "none: nothing uploaded yet; partial: uploading, or some file was refused (the group's results cap); "
        "complete: every file of the output directory is kept."))


_CHECKSUM = OpenApiParameter(CHECKSUM_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                             description="Hex sha256 of the bytes sent.")
_BINARY = {(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The file's bytes.")}


def _readable_job_id(request: Request, job_id: int) -> int:
    if not svc.readable_jobs(request.user).filter(pk=job_id).exists():
        raise NotFound()
    return job_id


def file_chunks_sync(handle: BinaryIO, chunk_bytes: int = DOWNLOAD_CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes, ``chunk_bytes`` at a time; the file is closed when they end or the reader stops. What a
    WSGI server is given: Django's WSGI path reads an async iterator whole into memory first."""
    try:
        while chunk := handle.read(chunk_bytes):
            yield chunk
    finally:
        handle.close()


async def file_chunks(handle: BinaryIO, chunk_bytes: int = DOWNLOAD_CHUNK_BYTES) -> AsyncIterator[bytes]:
    """The same chunks, each read in a thread. What an ASGI server is given: Django's ASGI path reads a synchronous
    iterator whole into memory first (``sync_to_async(list)``)."""
    chunks = file_chunks_sync(handle, chunk_bytes)
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        await asyncio.to_thread(chunks.close)


def _send(request: Request, opened: Any) -> StreamingHttpResponse:
    handle, row = opened
    under_asgi = isinstance(request._request, ASGIRequest)
    chunks = (file_chunks if under_asgi else file_chunks_sync)(handle, DOWNLOAD_CHUNK_BYTES)
    response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
    response._resource_closers.append(handle.close)  # closed even when the body is never sent
    response["Content-Disposition"] = content_disposition_header(True, posixpath.basename(row.path))
    response[CHECKSUM_HEADER] = row.sha256
    response["Content-Length"] = str(row.size_bytes)
    return response


class JobResultsView(APIView):
    """The files a job's agent uploaded from its output directory (design §14)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(operation_id="jobs_results_retrieve", tags=["jobs"], responses=JobResultsSerializer,
                   examples=[OpenApiExample("complete", response_only=True, value={
                       "files": [{"path": "metrics/final.json", "size_bytes": 412, "sha256": "9f86d08…",
                                  "download_url": "/api/jobs/42/results/files/metrics/final.json"}],
                       "total_bytes": 412, "state": "complete"})])
    def get(self, request: Request, id: int) -> Response:  # ``id``: named as the router names it
        return Response(svc.listing(_readable_job_id(request, id)))


class _BytesView(APIView):
    """A download: the bytes on success; every error (401, 404, 429 …) as JSON, whatever ``?format=`` or
    ``Accept`` asked for."""

    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer, BinaryRenderer]  # Accept: application/octet-stream works

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


class JobResultFileView(_BytesView):
    """One uploaded file's bytes (``X-Checksum-SHA256``: their sha256)."""

    @extend_schema(operation_id="jobs_results_files_retrieve", tags=["jobs"], responses=_BINARY,
                   parameters=[_CHECKSUM, OpenApiParameter("file_path", OpenApiTypes.STR, OpenApiParameter.PATH,
                                                           description="The file's path, as listed.")])
    def get(self, request: Request, id: int, file_path: str) -> StreamingHttpResponse:
        job_id = _readable_job_id(request, id)
        try:
            path = svc.clean_result_path(file_path)
        except ValidationError:
            raise NotFound("No such file in this job's results.") from None
        opened = svc.open_file(job_id, ResultKind.OUTPUT, path)
        if opened is None:
            raise NotFound("No such file in this job's results.")
        return _send(request, opened)


class JobCheckpointView(_BytesView):
    """The job's final checkpoint, uploaded by its agent when the job ended (404 when none was kept)."""

    @extend_schema(operation_id="jobs_checkpoint_retrieve", tags=["jobs"], responses=_BINARY,
                   parameters=[_CHECKSUM])
    def get(self, request: Request, id: int) -> StreamingHttpResponse:
        opened = svc.open_file(_readable_job_id(request, id), ResultKind.CHECKPOINT)
        if opened is None:
            raise NotFound("No final checkpoint of this job was kept on the portal.")
        return _send(request, opened)


# --- the agents' side ------------------------------------------------------------------------------------------
KINDS = {"files": ResultKind.OUTPUT, "checkpoint": ResultKind.CHECKPOINT}


def _agent_node(request: HttpRequest) -> int | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not header.lower().startswith("bearer "):
        return None
    node = node_for_agent_token(header[7:].strip())
    if node is None or node.state == NodeState.RETIRED:
        return None
    return node.pk


def _agent_view(handler: Any) -> Any:
    """Authenticate the agent, translate the service's refusals into JSON answers."""

    @csrf_exempt
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        node_id = _agent_node(request)
        if node_id is None:
            return JsonResponse({"detail": "Unknown or revoked agent token.", "code": "auth"}, status=401)
        try:
            answer = handler(request, node_id, **kwargs)
        except svc.ResultsRefusedError as refused:
            answer = refused.answer
        except ValidationError as exc:
            return JsonResponse(exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages},
                                status=400)
        return JsonResponse(answer.body, status=answer.status)

    view.__name__ = handler.__name__
    return view


def _manifest(request: HttpRequest, node_id: int, job_id: int) -> svc.Answer:
    if request.method != "GET":
        return svc.Answer(405, {"detail": "GET only."})
    return svc.agent_manifest(node_id, job_id)


def _upload(request: HttpRequest, node_id: int, job_id: int, kind: str, file_path: str) -> svc.Answer:
    if request.method != "PUT":
        return svc.Answer(405, {"detail": "PUT only."})
    if kind not in KINDS:
        return svc.Answer(404, {"detail": f"Unknown kind of result {kind!r}.", "code": "not_found"})
    data = request.read(svc.chunk_bytes() + 1)
    if len(data) > svc.chunk_bytes():
        return svc.Answer(413, {"detail": f"A chunk may have at most {svc.chunk_bytes()} bytes.",
                                "code": "chunk_too_large"})
    meta = request.META
    return svc.receive_chunk(node_id, job_id, KINDS[kind], file_path, sha256=meta.get("HTTP_X_CHECKSUM_SHA256"),
                             total_size=meta.get("HTTP_X_TOTAL_SIZE"), offset=meta.get("HTTP_X_OFFSET", "0"),
                             data=data, checkpoint_sequence=meta.get("HTTP_X_CHECKPOINT_SEQUENCE"))


def _complete(request: HttpRequest, node_id: int, job_id: int) -> svc.Answer:
    if request.method != "POST":
        return svc.Answer(405, {"detail": "POST only."})
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return svc.Answer(400, {"detail": "The body is not JSON."})
    if not isinstance(body, dict):
        return svc.Answer(400, {"detail": "The body is not a JSON object."})
    return svc.complete(node_id, job_id, body.get("files"), body.get("checkpoint"))


agent_manifest_view = _agent_view(_manifest)
agent_upload_view = _agent_view(_upload)
agent_complete_view = _agent_view(_complete)
