"""What-if decision endpoints: ``POST /api/decide/p1|p2|p3/`` → ``scheduler.contract.decide`` (design §5)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest

from tests.portal.conftest import World


class FakeContractError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@pytest.fixture
def fake_contract(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def decide(kind: str, request: dict[str, Any]) -> dict[str, Any]:
        calls.append((kind, request))
        if "bad" in request:
            raise FakeContractError("jobs[0].hazard_per_s", "must be > 0")
        return {"kind": kind, "ok": True}

    module = types.SimpleNamespace(decide=decide, ContractError=FakeContractError)
    monkeypatch.setitem(sys.modules, "scheduler.contract", module)
    return calls


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["p1", "p2", "p3"])
def test_decide_calls_contract(kind: str, world: World, client_for: Any, fake_contract: Any) -> None:
    response = client_for("researcher").post(f"/api/decide/{kind}/", {"x": 1}, format="json")
    assert response.status_code == 200
    assert response.json() == {"kind": kind, "ok": True}
    assert fake_contract == [(kind, {"x": 1})]


@pytest.mark.django_db
def test_decide_contract_error_is_400_naming_field(world: World, client_for: Any, fake_contract: Any) -> None:
    response = client_for("researcher").post("/api/decide/p1/", {"bad": 1}, format="json")
    assert response.status_code == 400
    assert response.json() == {"jobs[0].hazard_per_s": ["must be > 0"]}


@pytest.mark.django_db
def test_decide_needs_an_object(world: World, client_for: Any, fake_contract: Any) -> None:
    response = client_for("researcher").post("/api/decide/p3/", [1, 2], format="json")
    assert response.status_code == 400
    assert fake_contract == []


@pytest.mark.django_db
def test_decide_p3_with_the_real_scheduler(world: World, client_for: Any) -> None:
    # The scheduler core is part of the project: a missing or broken scheduler.contract must fail here, not skip.
    importlib.import_module("scheduler.contract")
    body = {"capacity_bytes_per_s": 125e6, "flows": [{"id": "f1", "bytes": 1e9, "notice_s": 60, "restart_s": 5}]}
    response = client_for("researcher").post("/api/decide/p3/", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["admitted"][0]["id"] == "f1"
    bad = client_for("researcher").post("/api/decide/p3/", {**body, "capacity_bytes_per_s": -1}, format="json")
    assert bad.status_code == 400 and "capacity_bytes_per_s" in str(bad.json())


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["p1", "p2", "p3"])
def test_decide_refuses_anonymous_callers(kind: str, world: World, client_for: Any, fake_contract: Any) -> None:
    """The what-if endpoints run scheduler code on request bodies: signed-in users only."""
    response = client_for(None).post(f"/api/decide/{kind}/", {"x": 1}, format="json")
    assert response.status_code in (401, 403)
    assert fake_contract == []
