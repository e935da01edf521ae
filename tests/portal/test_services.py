"""The service layer: tokens stored hashed, reclaim kinds, hooks after commit, atomic multi-row changes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection

from portal.core.lifecycle import InvalidTransition
from portal.core.models import AuditLog, LendingWindow, Node, Placement, ReclaimEvent
from portal.core.services import jobs as job_services
from portal.core.services import nodes as node_services
from portal.core.services import reclaims as reclaim_services
from portal.core.services.gpu_catalogue import lookup_gpu
from tests.portal import factories as f
from tests.portal.conftest import World


@pytest.mark.django_db
def test_agent_token_is_stored_only_hashed(world: World) -> None:
    raw = world.token
    node = Node.objects.get(pk=world.node.pk)
    assert node.agent_token_hash != raw and len(node.agent_token_hash) == 64
    assert node.check_agent_token(raw)
    # The raw token appears nowhere in the database: search every text column of every core table.
    with connection.cursor() as cursor:
        for model in (Node, AuditLog):
            cursor.execute(f"SELECT * FROM {model._meta.db_table}")
            for row in cursor.fetchall():
                assert not any(isinstance(v, str) and raw in v for v in row)
    assert raw not in str(list(AuditLog.objects.values_list("detail", flat=True)))


@pytest.mark.django_db
def test_register_response_carries_token_once(world: World, client_for: Any) -> None:
    body = {"name": "fresh-01", "building": world.building.pk, "gpus": [{"model": "NVIDIA A100-SXM4-40GB"}]}
    response = client_for("provider").post("/api/nodes/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    node = Node.objects.get(pk=data["id"])
    assert node.provider == world.lab  # the provider's only lab is the default
    assert node.check_agent_token(data["agent_token"])
    assert data["gpus"][0]["model"] == "A100 40GB" and data["gpus"][0]["vram_gb"] == 40
    detail = client_for("provider").get(f"/api/nodes/{node.pk}/").json()
    assert "agent_token" not in detail and "agent_token_hash" not in detail


@pytest.mark.django_db
def test_rotate_and_revoke_agent_token(world: World) -> None:
    new = node_services.rotate_agent_token(world.node, world.users["provider"])
    assert node_services.node_for_agent_token(world.token) is None
    assert node_services.node_for_agent_token(new) == world.node
    node_services.revoke_agent_token(world.node, world.users["provider"])
    assert node_services.node_for_agent_token(new) is None
    assert node_services.node_for_agent_token("") is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "notice_s", "killswitch", "kind", "end"),
    [
        ("online", 120, False, "scheduled", "draining"),
        ("registered", 120, False, "scheduled", "reclaimed"),  # nothing to drain
        ("online", 0, False, "emergency", "reclaimed"),
        ("draining", 0, False, "emergency", "reclaimed"),  # escalation: the provider always wins
        ("offline", 0, False, "emergency", "reclaimed"),
        ("online", 0, True, "killswitch", "reclaimed"),
        ("reclaimed", 0, True, "killswitch", "reclaimed"),  # the panic button always works
    ],
)
def test_request_reclaim_kinds(start: str, notice_s: float, killswitch: bool, kind: str, end: str, world: World,
                               dispatch_spy: Any, django_capture_on_commit_callbacks: Any) -> None:
    Node.objects.filter(pk=world.node.pk).update(state=start)
    world.node.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        event = reclaim_services.request_reclaim(world.node, world.users["provider"], notice_s,
                                                 killswitch=killswitch)
    node = Node.objects.get(pk=world.node.pk)
    assert (event.kind, node.state, node.killswitch_engaged) == (kind, end, killswitch)
    assert event.requested_by == world.users["provider"]
    assert event.deadline_at - event.requested_at < dt.timedelta(seconds=notice_s + 5)
    assert dispatch_spy.calls == [("control.run_reclaim", event.pk)]


@pytest.mark.django_db
@pytest.mark.parametrize(("start", "notice_s"), [("draining", 60), ("reclaimed", 0), ("retired", 60)])
def test_request_reclaim_refused_changes_nothing(start: str, notice_s: float, world: World,
                                                 dispatch_spy: Any, django_capture_on_commit_callbacks: Any) -> None:
    Node.objects.filter(pk=world.node.pk).update(state=start)
    world.node.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(InvalidTransition):
        reclaim_services.request_reclaim(world.node, world.users["provider"], notice_s)
    assert ReclaimEvent.objects.count() == 0
    assert Node.objects.get(pk=world.node.pk).state == start
    assert dispatch_spy.calls == []


@pytest.mark.django_db
def test_reclaim_api_conflict_is_409(world: World, client_for: Any) -> None:
    Node.objects.filter(pk=world.node.pk).update(state="retired")
    response = client_for("provider").post(f"/api/nodes/{world.node.pk}/emergency-reclaim/")
    assert response.status_code == 409
    assert "state" in response.json()


@pytest.mark.django_db
def test_services_check_permissions_too(world: World) -> None:
    """The web pages call services directly: the service refuses a non-owner even without the API in front."""
    with pytest.raises(PermissionDenied):
        reclaim_services.emergency_reclaim(world.other_node, world.users["provider"])
    with pytest.raises(PermissionDenied):
        job_services.cancel_job(world.job, world.users["other_researcher"])
    with pytest.raises(PermissionDenied):
        node_services.register_node(world.users["researcher"], provider=world.lab, building=world.building,
                                    name="x-1", gpus=[{"model": "T4"}])
    assert Node.objects.get(pk=world.other_node.pk).state == "online"


@pytest.mark.django_db
def test_lend_again_clears_killswitch_and_dispatches(world: World, dispatch_spy: Any,
                                                     django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        reclaim_services.engage_killswitch(world.node, world.users["provider"])
        node_services.lend_again(world.node, world.users["provider"])
    node = Node.objects.get(pk=world.node.pk)
    assert (node.state, node.killswitch_engaged) == ("offline", False)
    assert dispatch_spy.names() == ["control.run_reclaim", "control.node_lent_again"]


@pytest.mark.django_db
def test_submit_and_cancel_job_dispatch_after_commit(world: World, dispatch_spy: Any,
                                                     django_capture_on_commit_callbacks: Any) -> None:
    researcher = world.users["researcher"]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = job_services.submit_job(researcher, group=world.group, name="gpt", command="python x.py",
                                      gpu_count=2, expected_runtime_s=60, ckpt_bytes_estimate=10**6)
    assert dispatch_spy.calls == [] and len(callbacks) == 1  # nothing before commit
    callbacks[0]()
    assert dispatch_spy.calls == [("control.place_job", job.pk)]
    f.place_job(job, world.node, [0, 1])
    with django_capture_on_commit_callbacks(execute=True):
        job_services.cancel_job(job, researcher)
    job.refresh_from_db()
    assert job.state == "cancelled" and job.finished_at is not None
    placement = Placement.objects.get(job=job)
    assert placement.ended_at is not None and placement.end_reason == "cancelled"
    assert dispatch_spy.calls[-1] == ("control.stop_cancelled_job", job.pk)
    with pytest.raises(InvalidTransition):
        job_services.cancel_job(job, researcher)


@pytest.mark.django_db
def test_set_lending_windows_replaces_all_or_nothing(world: World) -> None:
    provider = world.users["provider"]
    node_services.set_lending_windows(world.node, provider, [
        {"weekday": d, "start_time": dt.time(20), "end_time": dt.time(8)} for d in range(5)])
    assert LendingWindow.objects.filter(node=world.node).count() == 5
    with pytest.raises(ValidationError) as error:
        node_services.set_lending_windows(world.node, provider, [
            {"weekday": 5, "start_time": dt.time(0), "end_time": dt.time(23)},
            {"weekday": 9, "start_time": dt.time(0), "end_time": dt.time(23)}])
    assert "lending_windows" in error.value.message_dict
    assert LendingWindow.objects.filter(node=world.node).count() == 5
    node_services.set_lending_windows(world.node, provider, [])
    assert LendingWindow.objects.filter(node=world.node).count() == 0


@pytest.mark.django_db
def test_update_node_renames_access_link(world: World) -> None:
    node = node_services.update_node(world.node, world.users["provider"], name="vision-99", gpu_floor=2)
    assert node.access_link.name == "access-vision-99" and node.gpu_floor == 2 and node.lendable_gpu_count == 0
    with pytest.raises(ValidationError):
        node_services.update_node(world.node, world.users["provider"], state="online")


@pytest.mark.parametrize(
    ("name", "model", "vram"),
    [("RTX 3090", "RTX 3090", 24), ("NVIDIA GeForce RTX 4090", "RTX 4090", 24), ("a100", "A100", 80),
     ("NVIDIA A100-SXM4-80GB", "A100", 80), ("A6000", "RTX A6000", 48), ("NVIDIA H100 80GB HBM3", "H100", 80),
     ("h200", "H200", 141), ("L40S", "L40S", 48), ("Tesla V100", "V100", 32), ("T4", "T4", 16)],
)
def test_gpu_catalogue_lookup(name: str, model: str, vram: float) -> None:
    spec = lookup_gpu(name)
    assert spec is not None and (spec.model, spec.vram_gb) == (model, vram)


@pytest.mark.parametrize("name", ["RTX 9999", "", "Voodoo", None, 3090])
def test_gpu_catalogue_unknown(name: Any) -> None:
    assert lookup_gpu(name) is None


@pytest.mark.django_db
def test_service_validation_names_the_field(world: World) -> None:
    """Pages call services with form values (Decimals included); bad ones raise ValidationError naming the field."""
    from decimal import Decimal

    researcher = world.users["researcher"]
    job = job_services.submit_job(researcher, group=world.group, name="ok", command="x", gpu_count=1,
                                  expected_runtime_s=Decimal("60"), ckpt_bytes_estimate=10, restart_s=Decimal("2.5"),
                                  vram_gb_per_gpu=Decimal("8"), min_capability=Decimal("7.5"))
    assert job.restart_s == 2.5 and job.min_capability == Decimal("7.5")
    for field, value in [("gpu_count", 0), ("expected_runtime_s", float("nan")), ("ckpt_bytes_estimate", -1),
                         ("restart_s", -1), ("priority_class", "vip"), ("min_capability", "x")]:
        kwargs: dict[str, Any] = {"group": world.group, "name": "j", "command": "x", "gpu_count": 1,
                                  "expected_runtime_s": 60, "ckpt_bytes_estimate": 10, field: value}
        with pytest.raises(ValidationError) as error:
            job_services.submit_job(researcher, **kwargs)
        assert field in error.value.message_dict
    with pytest.raises(ValidationError) as error:
        reclaim_services.request_reclaim(world.node, world.users["provider"], -1)
    assert "notice_s" in error.value.message_dict
    with pytest.raises(ValidationError) as error:
        node_services.register_node(None, provider=world.lab, building=world.building, name="n-1",
                                    gpus=[{"model": "RTX 3090"}], gpu_floor=2)
    assert "gpu_floor" in error.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize(("role", "url_of", "state_update"), [
    ("provider", lambda w: f"/api/nodes/{w.node.pk}/lend-again/", None),  # online: nothing to lend again
    ("researcher", lambda w: f"/api/jobs/{w.job.pk}/cancel/", "completed"),
])
def test_refused_transitions_answer_409_and_change_nothing(role: str, url_of: Any, state_update: str | None,
                                                           world: World, client_for: Any) -> None:
    from portal.core.models import Job
    from tests.portal.api_helpers import snapshot

    if state_update:
        Job.objects.filter(pk=world.job.pk).update(state=state_update)
    before = snapshot()
    response = client_for(role).post(url_of(world))
    assert response.status_code == 409 and "state" in response.json()
    assert snapshot() == before


@pytest.mark.django_db
def test_migrations_match_models() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("makemigrations", "core", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
