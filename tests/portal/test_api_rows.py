"""The lists and details answered from plain rows (portal/core/api/rows.py, docs/design.md §10) answer exactly what their
serializers would: the same JSON, key for key and in the same order, for every node, job and reclaim of the demo
campus with two days of history, plus the odd cases the demo lacks (no access link, lending windows, a reclaim
nobody requested, a job with no loss budget); so do the topology's buildings and switches and a submit's answer.
And ``count`` stays the number of matching objects whether the page tells it or it is counted."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from portal.core import permissions
from portal.core.api import serializers as s
from portal.core.models import (
    Building,
    Job,
    LendingWindow,
    Node,
    Placement,
    Provider,
    ReclaimEvent,
    ResearchGroup,
    Switch,
)
from portal.core.models.reclaims import ReclaimKind
from tests.portal import factories as f

pytestmark = pytest.mark.django_db


def _as_json(data: Any) -> str:
    """What the API would put on the wire for ``data`` (its key order included)."""
    return JSONRenderer().render(data).decode()


@pytest.fixture
def campus() -> dict[str, Any]:
    """The demo campus with two days of history, and the cases it lacks."""
    call_command("seed_campus", "--demo-users", verbosity=0)
    call_command("seed_history", "--past-only", verbosity=0)
    admin = f.make_user(staff=True)
    researcher = f.make_user()
    provider_user = f.make_user()
    group = ResearchGroup.objects.order_by("pk").first()
    lab = Provider.objects.order_by("pk").first()
    assert group is not None and lab is not None
    group.members.add(researcher)
    lab.members.add(provider_user)
    building = f.make_building("Rows Hall")
    bare, _ = f.make_node(lab, building, name="rows-bare", gpus=2, gpu_floor=1)
    Node.objects.filter(pk=bare.pk).update(access_link=None, last_heartbeat_at=timezone.now())
    LendingWindow.objects.create(node=bare, weekday=5, start_time=dt.time(22, 30), end_time=dt.time(6, 0))
    LendingWindow.objects.create(node=bare, weekday=0, start_time=dt.time(8, 0), end_time=dt.time(9, 15, 30))
    job = f.make_job(group, researcher, name="rows-ünïcode", loss_budget_s=None, min_capability="7.5")
    f.place_job(job, bare, [0])
    ReclaimEvent.objects.create(node=bare, requested_by=None, kind=ReclaimKind.EMERGENCY,
                                deadline_at=timezone.now())
    return {"admin": admin, "researcher": researcher, "provider": provider_user, "lab": lab}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _expected(serializer_class: Any, queryset: Any) -> list[Any]:
    return json.loads(_as_json(serializer_class(queryset, many=True).data))


def test_node_job_and_reclaim_lists_answer_what_their_serializers_would(campus: dict[str, Any]) -> None:
    for role in ("admin", "researcher", "provider"):
        _check_lists(campus, role)
    # A reclaim the provider may not see stays a 404 on its detail, as get_object() answered.
    hidden = ReclaimEvent.objects.exclude(pk__in=permissions.visible_reclaims(campus["provider"])).first()
    assert hidden is not None
    assert _client(campus["provider"]).get(f"/api/reclaims/{hidden.pk}/").status_code == 404


def _check_lists(campus: dict[str, Any], role: str) -> None:
    user = campus[role]
    client = _client(user)
    nodes = permissions.visible_nodes(user).order_by("name")
    jobs = permissions.visible_jobs(user).prefetch_related("placements__node")
    reclaims = permissions.visible_reclaims(user).order_by("-requested_at", "-pk")
    mine = nodes.filter(provider__members=user) if role == "provider" else None
    cases = [("/api/nodes/?limit=1000", s.NodeSerializer, nodes), ("/api/jobs/?limit=1000", s.JobSerializer, jobs),
             ("/api/reclaims/?limit=1000", s.ReclaimEventSerializer, reclaims)]
    if mine is not None:
        cases.append(("/api/nodes/?mine=1&limit=1000", s.NodeSerializer, mine))
    for url, serializer_class, queryset in cases:
        response = client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        expected = _expected(serializer_class, queryset)
        assert expected or (role, serializer_class) == ("provider", s.JobSerializer), f"{url}: nothing to list"
        body = json.loads(response.content)
        assert body["count"] == len(expected), url
        assert body["results"] == expected, url
        # Key order too: clients may print the JSON as it comes.
        assert [list(r) for r in body["results"]] == [list(r) for r in expected], url
        detail_url = url.split("?")[0]
        if serializer_class is not s.JobSerializer:  # the job detail has a serializer of its own
            for item in expected[:3] + expected[-2:]:
                assert client.get(f"{detail_url}{item['id']}/").content.decode() == _as_json(item), detail_url
        assert client.get(f"{detail_url}999999999/").status_code == 404


def test_odd_cases_counts_topology_and_a_submit_answer(campus: dict[str, Any]) -> None:
    _check_odd_cases(campus)
    _check_counts(campus)
    topology = _client(campus["researcher"]).get("/api/campus/topology/").json()
    assert topology["buildings"] == _expected(s.BuildingSerializer, Building.objects.order_by("name"))
    assert topology["switches"] == _expected(s.SwitchSerializer, Switch.objects.order_by("name"))
    submitted = _client(campus["researcher"]).post("/api/jobs/", {
        "name": "rows-submit", "gpu_count": 1, "expected_runtime_s": 60.0, "ckpt_bytes_estimate": 4096,
        "command": "python train.py", "min_capability": "0.0"}, format="json", HTTP_IDEMPOTENCY_KEY="rows-1")
    assert submitted.status_code == 201, submitted.content[:300]
    job = Job.objects.get(name="rows-submit")
    assert submitted.content.decode() == _as_json(s.JobSerializer(job).data)


def _check_odd_cases(campus: dict[str, Any]) -> None:
    nodes = {n["name"]: n for n in _client(campus["admin"]).get("/api/nodes/?limit=1000").json()["results"]}
    bare = nodes["rows-bare"]
    assert bare["access_link_bytes_per_s"] is None
    assert bare["lendable_gpu_count"] == 1 and len(bare["gpus"]) == 2
    assert [w["start_time"] for w in bare["lending_windows"]] == ["08:00:00", "22:30:00"]
    jobs = {j["name"]: j for j in _client(campus["admin"]).get("/api/jobs/?limit=1000").json()["results"]}
    assert jobs["rows-ünïcode"]["node"] == "rows-bare" and jobs["rows-ünïcode"]["loss_budget_s"] is None
    assert jobs["rows-ünïcode"]["min_capability"] == "7.5"
    bare_pk = Node.objects.get(name="rows-bare").pk
    reclaims = _client(campus["admin"]).get(f"/api/reclaims/?node={bare_pk}").json()
    assert reclaims["results"][0]["requested_by"] is None
    finished = Placement.objects.filter(ended_at__isnull=False).values_list("job_id", flat=True)
    closed = Job.objects.filter(pk__in=finished).exclude(placements__ended_at__isnull=True).first()
    assert closed is not None and jobs[closed.name]["node"] is None  # only an open placement names a node


def _check_counts(campus: dict[str, Any]) -> None:
    client = _client(campus["admin"])
    total = ReclaimEvent.objects.count()
    assert total > 5
    for query in ("limit=5", "limit=5&offset=5", f"limit=5&offset={total - 2}", f"offset={total}",
                  f"offset={total + 10}", "limit=1000", "kind=emergency&limit=1"):
        body = client.get(f"/api/reclaims/?{query}").json()
        expected = ReclaimEvent.objects.filter(kind="emergency").count() if "kind=" in query else total
        assert body["count"] == expected, query
    past_the_end = client.get(f"/api/reclaims/?offset={total + 10}").json()
    assert past_the_end["results"] == [] and past_the_end["next"] is None
    assert client.get("/api/reclaims/?node=999999999").json() == {"count": 0, "next": None, "previous": None,
                                                                    "results": []}
