"""The API's OpenAPI schema generator (drf-spectacular's AutoSchema, specialised for ReclaimNet)."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema


class ReclaimNetAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema; the project's additions to every operation live here."""
