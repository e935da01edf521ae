"""Revoking the caller's API token (design §13): what ``reclaimnet logout`` asks for, so a token a researcher
has logged out of stops working on the portal, not only on their disk."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class TokenRevokeView(APIView):
    """``POST /api/auth/token/revoke/``: delete the caller's API token. Requests carrying it answer 401 from
    then on, and the next ``POST /api/auth/token/`` issues a new one. Signed in by session, the caller's token
    (if any) is deleted just the same; the session itself stays."""

    @extend_schema(request=None, responses={204: OpenApiResponse(description="The token is revoked.")})
    def post(self, request: Request) -> Response:
        Token.objects.filter(user=request.user).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
