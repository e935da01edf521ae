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
