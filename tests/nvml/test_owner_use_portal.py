"""Owner activity at the portal without a websocket (design §1 "Owner activity and MIG"): which GPUs count as
owner use, the batch's fixed statement count, the policy through the API and the node page, and what the
provider's node page and the admin dashboard show."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.control.link.gpu_state import check_gpu_state
from portal.control.owner_use import owner_use_gpus
from tests.portal import factories as f

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_process")]


def _gpu(index: int, count: int, memory_bytes: int = 0, mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"index": index, "mig_mode": "enabled" if mig is not None else "", "mig_instances": mig or [],
            "foreign_processes": {"count": count, "memory_bytes": memory_bytes,
                                  "pids": list(range(1000, 1000 + min(count, 16)))}}


def test_owner_use_is_a_foreign_process_on_a_held_gpu_or_more_foreign_gpus_than_the_floor() -> None:
    items = check_gpu_state("heartbeat", [_gpu(0, 1), _gpu(1, 0), _gpu(2, 3), _gpu(3, 0)])
    assert [g["index"] for g in owner_use_gpus(items, held={0}, gpu_floor=1)] == [0]  # GPU 2: the lab's kept one
    assert [g["index"] for g in owner_use_gpus(items, held={0}, gpu_floor=0)] == [0, 2]
    assert [g["index"] for g in owner_use_gpus(items, held=set(), gpu_floor=2)] == []  # both within the floor
    assert [g["index"] for g in owner_use_gpus(items, held=set(), gpu_floor=1)] == [0, 2]  # one more than kept
    assert owner_use_gpus(check_gpu_state("heartbeat", [_gpu(0, 0)]), held={0}, gpu_floor=0) == []


def _online_nodes(count: int, offset: int) -> list[tuple[Any, str]]:
    from portal.core.lifecycle import nodes as node_lifecycle
    from tests.control.control_helpers import make_node

    nodes = [make_node(f"n{offset + k}") for k in range(count)]
    for node, _ in nodes:
        node_lifecycle.come_online(node)
    return nodes


def _statements(count: int, offset: int) -> int:
    from portal.control.link.handlers import HeartbeatSeen, record_heartbeats

    nodes = _online_nodes(count, offset)
    now = timezone.now()
    beats = [HeartbeatSeen(node.pk, None, token, now, {
        "type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [],
        "gpu_state": [_gpu(0, 0), _gpu(1, k % 2, 2**30)]}) for k, (node, token) in enumerate(nodes)]
    with CaptureQueriesContext(connection) as captured:
        assert record_heartbeats(beats) == []
    return len(captured.captured_queries)


def test_recording_gpu_state_costs_as_many_statements_for_40_nodes_as_for_4(settings: Any) -> None:
    from portal.core.models import Gpu, Node

    settings.RECLAIMNET = {**settings.RECLAIMNET, "OWNER_USE_HEARTBEATS": 5}
    assert _statements(4, 0) == _statements(40, 100)
    assert Gpu.objects.filter(foreign_process_count=1, foreign_memory_bytes=2**30).count() == 22
    assert Node.objects.filter(owner_use_streak=1).count() == 22  # the odd ones: GPU 1 used by the lab, floor 0


def test_the_policy_is_edited_through_the_api_and_a_bad_one_named() -> None:
    provider_user = f.make_user("prov")
    lab = f.make_provider("Lab X", members=(provider_user,))
    node, _ = f.make_node(lab, f.make_building(), gpus=2)
    api = APIClient()
    api.force_authenticate(provider_user)
    assert api.get(f"/api/nodes/{node.pk}/").json()["owner_use_policy"] == "notify"  # the default
    response = api.patch(f"/api/nodes/{node.pk}/", {"owner_use_policy": "reclaim"}, format="json")
    assert response.status_code == 200 and response.json()["owner_use_policy"] == "reclaim"
    response = api.patch(f"/api/nodes/{node.pk}/", {"owner_use_policy": "evict"}, format="json")
    assert response.status_code == 400 and "owner_use_policy" in response.json()
    node.refresh_from_db()
    assert node.owner_use_policy == "reclaim"
    gpus = api.get(f"/api/nodes/{node.pk}/").json()["gpus"]
    assert {"mig_mode", "mig_instances", "foreign_process_count", "foreign_memory_bytes"} <= set(gpus[0])
    assert "foreign_pids" not in gpus[0]  # the lab's PIDs stay on its own page


def test_node_page_and_dashboard_show_mig_and_owner_use() -> None:
    from portal.control.owner_use import store_gpu_state
    from portal.core.lifecycle import nodes as node_lifecycle

    provider_user = f.make_user("prov2", password="pw-123456789")
    admin = f.make_user("admin2", staff=True, password="pw-123456789")
    lab = f.make_provider("Lab Y", members=(provider_user,))
    node, _ = f.make_node(lab, f.make_building(), gpus=2, name="lab-y-01")
    node_lifecycle.come_online(node)
    mig = [{"uuid": f"MIG-{k}", "memory_bytes": 10 * 2**30} for k in range(3)]
    store_gpu_state({node.pk: (check_gpu_state("heartbeat", [_gpu(0, 0, mig=mig), _gpu(1, 2, 5100273664)]),
                               timezone.now())})
    client = Client()
    client.force_login(provider_user)
    page = client.get(f"/provider/nodes/{node.pk}/").content.decode()
    assert "MIG: 3 instances" in page and "in use by owner (2 processes, 5.1 GB)" in page
    assert 'name="owner_use_policy"' in page
    response = client.post(f"/provider/nodes/{node.pk}/settings/",
                           {"gpu_floor": "0", "owner_use_policy": "ignore", "w-TOTAL_FORMS": "0",
                            "w-INITIAL_FORMS": "0"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.owner_use_policy == "ignore"
    client.force_login(admin)
    dashboard = client.get("/dashboard/").content.decode()
    assert 'data-testid="owner-use"' in dashboard and "lab-y-01" in dashboard
    assert "in use by owner (2 processes, 5.1 GB)" in dashboard and "MIG: 3 instances" in dashboard
