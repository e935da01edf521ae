"""Django admin: every core model is registered, its list page renders, and tokens/states are read-only."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from tests.portal.conftest import World

CORE_MODELS = list(apps.get_app_config("core").get_models())


def test_every_core_model_is_registered() -> None:
    missing = [model.__name__ for model in CORE_MODELS if model not in admin.site._registry]
    assert missing == []


def test_token_hash_and_states_are_read_only() -> None:
    from portal.core.models import Job, Node

    assert {"agent_token_hash", "state"} <= set(admin.site._registry[Node].readonly_fields)
    assert "state" in admin.site._registry[Job].readonly_fields


@pytest.mark.django_db
@pytest.mark.parametrize("model", CORE_MODELS, ids=lambda m: m.__name__)
def test_changelist_and_search_render(model: Any, world: World) -> None:
    client = Client()
    client.force_login(world.users["admin"])
    url = reverse(f"admin:core_{model._meta.model_name}_changelist")
    assert client.get(url).status_code == 200
    assert client.get(url, {"q": "vision"}).status_code == 200


@pytest.mark.django_db
def test_node_change_page_renders(world: World) -> None:
    client = Client()
    client.force_login(world.users["admin"])
    response = client.get(reverse("admin:core_node_change", args=[world.node.pk]))
    assert response.status_code == 200
    assert world.node.agent_token_hash.encode() in response.content


@pytest.mark.django_db
@pytest.mark.parametrize("model_name", ["auditlog", "decisionlog"])
def test_logs_are_append_only_in_admin(model_name: str, world: World) -> None:
    """The audit trail and the decision log are evidence: an admin can read them, not add, edit or delete."""
    from portal.core.models import AuditLog
    from portal.core.services.audit import audit

    entry = audit(world.users["provider"], "node.update", world.node)
    client = Client()
    client.force_login(world.users["admin"])
    assert client.get(reverse(f"admin:core_{model_name}_changelist")).status_code == 200
    assert client.get(reverse(f"admin:core_{model_name}_add")).status_code == 403
    if model_name == "auditlog":
        change = reverse("admin:core_auditlog_change", args=[entry.pk])
        assert client.get(change).status_code == 200  # a read-only view
        assert client.post(change, {"action": "nothing.happened"}).status_code == 403
        assert client.post(reverse("admin:core_auditlog_delete", args=[entry.pk]), {"post": "yes"}).status_code == 403
        assert AuditLog.objects.get(pk=entry.pk).action == "node.update"
