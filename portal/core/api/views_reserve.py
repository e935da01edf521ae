"""``/api/campus/links/{id}/reserve/``: a link's research reserve (design §4 "Calibrated reserve").

GET (any signed-in user): the reserve P3 keeps for research on the link, its source (calibrated, override,
default), the calibration's p95 share and sample count. PATCH (admins only): ``override_bytes_per_s`` — a
number of bytes/s in [β·B, B], or null to let the calibration count again; a bad value answers 400 naming it.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.control.reserve import ReserveError, reserve_rows, set_reserve_override
from portal.core import permissions
from portal.core.models import Link


class LinkReserveSerializer(serializers.Serializer):
    link = serializers.IntegerField(help_text="the link's id")
    name = serializers.CharField()
    capacity_bytes_per_s = serializers.FloatField()
    reserve_bytes_per_s = serializers.FloatField(help_text="B_min P3 keeps for research on this link")
    source = serializers.ChoiceField(choices=["calibrated", "override", "default"])
    p95_share = serializers.FloatField(allow_null=True, help_text="research's p95 share of the link, last 7 days")
    samples = serializers.IntegerField(help_text="class samples the last calibration saw")
    calibrated_at = serializers.DateTimeField(allow_null=True)
    override_bytes_per_s = serializers.FloatField(allow_null=True, help_text="an admin's reserve; null: none")


class ReserveOverrideSerializer(serializers.Serializer):
    override_bytes_per_s = serializers.FloatField(allow_null=True, required=True,
                                                  help_text="bytes/s in [0.3·capacity, capacity]; null clears it")


def _view(link: Link) -> dict[str, object]:
    row = next(r for r in reserve_rows() if r["link"].pk == link.pk)
    return {"link": link.pk, "name": link.name, **{k: v for k, v in row.items() if k not in ("link", "reserve_share")}}


class LinkReserveView(APIView):
    """One link's research reserve; admins may override it."""

    @extend_schema(responses=LinkReserveSerializer)
    def get(self, request: Request, id: int) -> Response:
        link = get_object_or_404(Link, pk=id)
        return Response(LinkReserveSerializer(_view(link)).data)

    @extend_schema(request=ReserveOverrideSerializer, responses=LinkReserveSerializer)
    def patch(self, request: Request, id: int) -> Response:
        link = get_object_or_404(Link, pk=id)
        if not permissions.is_admin(request.user):
            raise PermissionDenied("only a campus admin may override a link's research reserve")
        body = ReserveOverrideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            set_reserve_override(request.user, link, body.validated_data["override_bytes_per_s"])
        except ReserveError as exc:
            return Response({exc.field: [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(LinkReserveSerializer(_view(link)).data)
