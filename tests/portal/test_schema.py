"""The OpenAPI 3 schema generates with no warnings and validates."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from openapi_spec_validator import validate


@pytest.mark.django_db
def test_schema_generates_without_warnings_and_validates(tmp_path: Any) -> None:
    out = tmp_path / "schema.yaml"
    stderr = StringIO()
    # --fail-on-warn turns any drf-spectacular warning or error into a failure; --validate runs its own check.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out), stderr=stderr)
    assert "Warning" not in stderr.getvalue() and "Error" not in stderr.getvalue(), stderr.getvalue()
    spec = yaml.safe_load(out.read_text())
    validate(spec)  # openapi-spec-validator: raises on an invalid document
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path in ("/api/nodes/", "/api/nodes/{id}/reclaim/", "/api/nodes/{id}/emergency-reclaim/",
                 "/api/nodes/{id}/killswitch/", "/api/nodes/{id}/lend-again/", "/api/nodes/{id}/rotate-token/",
                 "/api/nodes/{id}/reclaim-preview/", "/api/nodes/{id}/lending-windows/", "/api/jobs/",
                 "/api/jobs/{id}/cancel/", "/api/jobs/{id}/checkpoints/", "/api/jobs/{id}/migrations/",
                 "/api/campus/topology/", "/api/reclaims/", "/api/summary/", "/api/decide/p1/",
                 "/api/decide/p2/", "/api/decide/p3/", "/api/auth/token/"):
        assert path in paths, path
    schemes = spec["components"]["securitySchemes"]
    assert {"cookieAuth", "tokenAuth"} <= set(schemes)
    # What responses really hold: a lost-heartbeat reclaim has no requester; a preview may know no loss-free notice.
    reclaim = spec["components"]["schemas"]["ReclaimEvent"]["properties"]
    assert reclaim["requested_by"].get("nullable") is True
    preview = spec["components"]["schemas"]["ReclaimPreview"]["properties"]
    assert preview["shortest_loss_free_notice_s"].get("nullable") is True


@pytest.mark.django_db
def test_schema_and_docs_are_served(client: Any) -> None:
    assert client.get("/api/schema/").status_code == 200
    assert b"swagger" in client.get("/api/docs/").content.lower()


def _spec(tmp_path: Any) -> dict[str, Any]:
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out))
    return yaml.safe_load(out.read_text())


def _codes(spec: dict[str, Any], path: str, method: str) -> set[str]:
    return set(spec["paths"][path][method]["responses"])


@pytest.mark.django_db
def test_every_operation_documents_the_errors_it_can_answer(tmp_path: Any) -> None:
    """Errors are derived per operation (method, detail route, lifecycle actions, idempotency), not blanket."""
    spec = _spec(tmp_path)
    # An idempotent create: invalid body, no credentials, not a member, key in progress, too big, key reused.
    assert _codes(spec, "/api/jobs/", "post") >= {"201", "400", "401", "403", "409", "413", "422"}
    assert "404" not in _codes(spec, "/api/jobs/", "post")  # no object in the path
    # A detail read: unknown or invisible object; nothing to conflict with, no body to be too big.
    detail = _codes(spec, "/api/jobs/{id}/", "get")
    assert {"200", "401", "404"} <= detail
    assert not detail & {"403", "409", "413", "422"}
    # Lifecycle actions answer 409; a token rotation (no lifecycle, not idempotent) does not.
    assert {"404", "409", "422"} <= _codes(spec, "/api/jobs/{id}/cancel/", "post")
    assert {"409"} <= _codes(spec, "/api/nodes/{id}/killswitch/", "post")
    assert not {"409", "415", "422"} & _codes(spec, "/api/nodes/{id}/rotate-token/", "post")  # reads no body
    assert "415" in _codes(spec, "/api/jobs/", "post")  # JSON only
    # A read that needs manage rights answers 403; a validated query answers 400; a list may answer 400 (limit).
    assert {"400", "403", "404"} <= _codes(spec, "/api/nodes/{id}/reclaim-preview/", "get")
    assert "400" in _codes(spec, "/api/nodes/", "get") and "404" not in _codes(spec, "/api/nodes/", "get")
    assert "400" not in _codes(spec, "/api/summary/", "get")
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "401" in operation["responses"], (method, path)
            for code, response in operation["responses"].items():
                if code >= "400":
                    assert response["content"]["application/json"]["schema"]["$ref"].startswith(
                        "#/components/schemas/"), (method, path, code)


@pytest.mark.django_db
def test_error_bodies_are_reusable_components(tmp_path: Any) -> None:
    spec = _spec(tmp_path)
    schemas = spec["components"]["schemas"]
    assert {"ErrorDetail", "ValidationError", "Conflict", "IdempotencyKeyReused"} <= set(schemas)
    responses = spec["paths"]["/api/jobs/"]["post"]["responses"]
    assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ValidationError"}
    assert responses["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/IdempotencyKeyReused"}
    assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert schemas["ValidationError"]["properties"]["non_field_errors"]["type"] == "array"


@pytest.mark.django_db
def test_idempotency_key_is_documented_exactly_on_idempotent_operations(tmp_path: Any) -> None:
    spec = _spec(tmp_path)
    idempotent = {("post", "/api/jobs/"), ("post", "/api/jobs/{id}/cancel/"), ("post", "/api/nodes/"),
                  ("post", "/api/nodes/{id}/reclaim/"), ("post", "/api/nodes/{id}/emergency-reclaim/"),
                  ("post", "/api/nodes/{id}/killswitch/"), ("post", "/api/nodes/{id}/lend-again/"),
                  ("post", "/api/jobs/{id}/resume/")}  # design §15
    found = {(method, path) for path, operations in spec["paths"].items()
             for method, operation in operations.items()
             if any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in operation.get("parameters", []))}
    assert found == idempotent
    created = spec["paths"]["/api/jobs/"]["post"]["responses"]["201"]["headers"]
    assert {"Idempotency-Key", "Idempotent-Replayed"} <= set(created)


@pytest.mark.django_db
def test_query_parameters_state_their_bounds_and_bodies_are_json(tmp_path: Any) -> None:
    spec = _spec(tmp_path)
    parameters = {p["name"]: p["schema"] for p in spec["paths"]["/api/jobs/"]["get"]["parameters"]}
    assert parameters["limit"]["minimum"] == 1 and parameters["offset"]["minimum"] == 0
    # The list filters are documented too (and validated: see test_validation).
    assert "running" in parameters["state"]["enum"] and parameters["group"]["type"] == "integer"
    nodes = {p["name"] for p in spec["paths"]["/api/nodes/"]["get"]["parameters"]}
    assert {"state", "provider", "building", "mine"} <= nodes
    reclaims = {p["name"] for p in spec["paths"]["/api/reclaims/"]["get"]["parameters"]}
    assert {"node", "kind"} <= reclaims
    body = spec["paths"]["/api/nodes/"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json"}
