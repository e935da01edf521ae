"""The API's OpenAPI schema generator (drf-spectacular's AutoSchema, specialised for ReclaimNet).

Every operation documents the error answers it can really give, derived from what serves it (not added
blanket): 400 where it reads a body, a validated query or an ``Idempotency-Key``; 401 wherever credentials are
checked; 403 on writes (permissions, role checks and the session's CSRF check) and on read actions that need
manage rights; 404 on routes that name an object; 409 on actions that move a lifecycle (a refused or raced
transition, ``transition_actions`` on the view) and on idempotent requests (the same key still in progress);
413 on operations that take a body (``portal.core.middleware.BodySizeLimitMiddleware``); 415 where a body is
parsed (a media type the operation does not take); 422 on idempotent
requests (a key reused with another body); 429 where a throttle, a wrong-token lockout or the login lockout
applies. Error bodies are reusable components.
The ``Idempotency-Key`` request header is documented on every view method wrapped by ``@idempotent``.
"""

from __future__ import annotations

from typing import Any

import uritemplate
from django.conf import settings
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiParameter
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.permissions import SAFE_METHODS

from portal.core.api import idempotency

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

_ARRAY_OF_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}

# name -> (schema, description of the component)
ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
    "ErrorDetail": {
        "type": "object",
        "description": "An error with one human-readable message.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "ValidationError": {
        "type": "object",
        "description": "Invalid input: each offending field (or request header) named with its messages; nested "
                       "fields answer nested objects (one per list item). ``non_field_errors`` holds messages "
                       "about the request as a whole; ``detail`` answers a body that could not be parsed.",
        "properties": {
            "detail": {"type": "string"},
            "non_field_errors": _ARRAY_OF_STRINGS,
        },
        "additionalProperties": {
            "anyOf": [
                {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
                {"type": "object"},
            ],
        },
    },
    "Conflict": {
        "type": "object",
        "description": "The request conflicts with the object's state: a refused lifecycle transition names the "
                       "states in ``state``; a transition raced by another request says so in ``detail``; an "
                       "idempotent request whose key is still being carried out names the header.",
        "properties": {
            "detail": {"type": "string"},
            "state": _ARRAY_OF_STRINGS,
            idempotency.HEADER: _ARRAY_OF_STRINGS,
        },
    },
    "IdempotencyKeyReused": {
        "type": "object",
        "description": "The Idempotency-Key was already used with a different request.",
        "properties": {idempotency.HEADER: _ARRAY_OF_STRINGS},
        "required": [idempotency.HEADER],
    },
}

# Authentication classes that answer 429 to an address sending too many wrong credentials (by dotted path, so the
# schema does not import them).
THROTTLING_AUTHENTICATORS = frozenset({"portal.core.auth.ThrottledTokenAuthentication"})

RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "required": False,
                               "description": "Seconds to wait before retrying."}}
WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True,
                                         "description": "The scheme to authenticate with."}}


class ReclaimNetAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the error answers, response headers and the idempotency header."""

    # --- what serves this operation -----------------------------------------------------------------------------

    def _view_method(self) -> Any:
        """The function that answers this operation (a viewset action, or the APIView's method handler)."""
        name = getattr(self.view, "action", None) or self.method.lower()
        return getattr(self.view, name, None)

    def _is_idempotent(self) -> bool:
        return bool(getattr(self._view_method(), idempotency.MARKER, False))

    def _has_path_object(self) -> bool:
        return bool(uritemplate.variables(self.path))

    def _moves_lifecycle(self) -> bool:
        return getattr(self.view, "action", None) in getattr(self.view, "transition_actions", ())

    def _can_be_throttled(self) -> bool:
        """A DRF throttle, an authenticator that locks out wrong tokens, or the password login under django-axes'
        lockout (``AXES_ENABLED``)."""
        if self.view.get_throttles():
            return True
        if any(f"{type(a).__module__}.{type(a).__qualname__}" in THROTTLING_AUTHENTICATORS
               for a in self.view.get_authenticators()):
            return True
        return isinstance(self.view, ObtainAuthToken) and bool(getattr(settings, "AXES_ENABLED", False))

    def _needs_manage_rights(self) -> bool:
        return getattr(self.view, "action", None) in getattr(self.view, "manage_actions", ()) \
            or self._checks_a_role()

    def _checks_a_role(self) -> bool:
        """A view for one role only (``reads_need_role = True``: staff's what-if evaluations): a signed-in caller
        of another role is refused its reads too."""
        return bool(getattr(self.view, "reads_need_role", False))

    # --- parameters ----------------------------------------------------------------------------------------------

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        if self._is_idempotent():
            parameters.append(idempotency.PARAMETER)
        return parameters

    # --- responses -----------------------------------------------------------------------------------------------

    def _error_component(self, name: str) -> dict[str, Any]:
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name,
                                      schema=ERROR_SCHEMAS[name])
        self.registry.register_on_missing(component)
        return component.ref

    def _parses_body(self) -> bool:
        """True when the operation reads a request body: a documented one, or any body sent with an
        Idempotency-Key (its digest is taken over the parsed body)."""
        return self.method in BODY_METHODS and (self._get_request_body() is not None or self._is_idempotent())

    def _reads_input(self) -> bool:
        """True when the operation parses a body, validates query parameters or reads a request header."""
        return self._parses_body() or any(parameter["in"] in (OpenApiParameter.QUERY, OpenApiParameter.HEADER)
                                          for parameter in self._get_parameters())

    def error_responses(self) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """``{status: (component, description, headers)}`` for the errors this operation can answer."""
        errors: dict[str, tuple[str, str, dict[str, Any]]] = {}
        if self._reads_input():
            errors["400"] = ("ValidationError", "Invalid input (see the named fields).", {})
        if self.view.get_authenticators():
            errors["401"] = ("ErrorDetail", "No credentials (or invalid ones) were sent.", WWW_AUTHENTICATE)
        if self.method not in SAFE_METHODS or self._needs_manage_rights():
            errors["403"] = ("ErrorDetail", "Signed in, but not allowed to do this (role, ownership, or the "
                                            "CSRF check of a cookie session).", {})
        if self._has_path_object():
            errors["404"] = ("ErrorDetail", "No such object, or one the caller may not see.", {})
        if self._moves_lifecycle() or self._is_idempotent():
            errors["409"] = ("Conflict", "The object's state refuses this, another request changed it meanwhile, "
                                         "or a request with this Idempotency-Key is still being carried out.",
                             RETRY_AFTER)
        if self.method in BODY_METHODS:
            errors["413"] = ("ErrorDetail", "The request body is larger than the portal accepts.", {})
        if self._parses_body():
            errors["415"] = ("ErrorDetail", "The body's Content-Type is not one the operation accepts.", {})
        if self._is_idempotent():
            errors["422"] = ("IdempotencyKeyReused", "The Idempotency-Key was already used with another request.",
                             {})
        if self._can_be_throttled():
            errors["429"] = ("ErrorDetail", "Too many requests; retry after the given delay.", RETRY_AFTER)
        return errors

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if self._is_idempotent():
            for code, response in responses.items():
                if code.startswith("2"):
                    response.setdefault("headers", {}).update({
                        idempotency.HEADER: {"schema": {"type": "string"},
                                             "description": "The key sent with the request, echoed."},
                        idempotency.REPLAYED_HEADER: {"schema": {"type": "string", "enum": ["true"]},
                                                      "description": "Present when this is the first answer "
                                                                     "replayed (nothing was created again)."},
                    })
        for code, (name, description, headers) in self.error_responses().items():
            if code in responses:
                continue
            response = {"description": description,
                        "content": {"application/json": {"schema": self._error_component(name)}}}
            if headers:
                response["headers"] = headers
            responses[code] = response
        return dict(sorted(responses.items()))
