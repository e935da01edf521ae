"""Safe retries on the API: the same Idempotency-Key and body replay the first answer and create one row; the
same key with another body is refused (422); failures keep no key; concurrent twins create one row."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from portal.core.models import IdempotencyKey, Job, Node, ReclaimEvent
from tests.portal import factories as f
from tests.portal.conftest import World

JOB = {"name": "retry-me", "gpu_count": 1, "expected_runtime_s": 600, "ckpt_bytes_estimate": 10**6,
       "command": "python train.py"}


def _post(client: APIClient, path: str, body: dict[str, Any] | None, key: str | None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(path, body or {}, format="json", **headers)


@pytest.mark.django_db
def test_the_same_key_twice_creates_one_job_and_replays_the_answer(client_for: Any) -> None:
    client = client_for("researcher")
    first = _post(client, "/api/jobs/", JOB, "k-1")
    second = _post(client, "/api/jobs/", JOB, "k-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Job.objects.filter(name="retry-me").count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused_naming_the_key(client_for: Any) -> None:
    client = client_for("researcher")
    assert _post(client, "/api/jobs/", JOB, "k-2").status_code == 201
    refused = _post(client, "/api/jobs/", JOB | {"gpu_count": 2}, "k-2")
    assert refused.status_code == 422
    assert "Idempotency-Key" in refused.json() and "k-2" in refused.json()["Idempotency-Key"][0]
    assert Job.objects.filter(name="retry-me").count() == 1


@pytest.mark.django_db
def test_without_a_key_every_post_creates(client_for: Any) -> None:
    client = client_for("researcher")
    assert _post(client, "/api/jobs/", JOB, None).status_code == 201
    assert _post(client, "/api/jobs/", JOB, None).status_code == 201
    assert Job.objects.filter(name="retry-me").count() == 2


@pytest.mark.django_db
def test_keys_belong_to_their_user(world: World, client_for: Any) -> None:
    other = f.make_user("second-researcher")
    world.group.members.add(other)
    assert _post(client_for("researcher"), "/api/jobs/", JOB, "shared").status_code == 201
    client = APIClient()
    client.force_authenticate(other)
    assert _post(client, "/api/jobs/", JOB, "shared").status_code == 201  # not a replay of someone else's
    assert Job.objects.filter(name="retry-me").count() == 2


@pytest.mark.django_db
def test_a_refused_request_keeps_no_key_so_the_fixed_retry_goes_through(client_for: Any) -> None:
    client = client_for("researcher")
    bad = _post(client, "/api/jobs/", JOB | {"gpu_count": 0}, "k-3")
    assert bad.status_code == 400 and "gpu_count" in bad.json()
    assert not IdempotencyKey.objects.exists()
    assert _post(client, "/api/jobs/", JOB, "k-3").status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", " ", "x" * 201, "ключ"])
def test_a_malformed_key_is_refused_with_the_header_named(client_for: Any, key: str) -> None:
    response = _post(client_for("researcher"), "/api/jobs/", JOB, key)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()
    assert not Job.objects.filter(name="retry-me").exists()


@pytest.mark.django_db
def test_a_retried_node_registration_replays_its_one_time_token_stored_encrypted(
        world: World, client_for: Any) -> None:
    client = client_for("provider")
    body = {"name": "retry-01", "building": world.building.pk, "gpus": [{"model": "RTX 3090"}]}
    first = _post(client, "/api/nodes/", body, "reg-1")
    second = _post(client, "/api/nodes/", body, "reg-1")
    assert first.status_code == second.status_code == 201 and first.json() == second.json()
    token = first.json()["agent_token"]
    assert Node.objects.get(name="retry-01").check_agent_token(token)
    with connection.cursor() as cursor:  # the raw token is nowhere in the key table
        cursor.execute(f"SELECT * FROM {IdempotencyKey._meta.db_table}")
        assert not any(token in str(v) for row in cursor.fetchall() for v in row)


@pytest.mark.django_db
def test_a_retried_emergency_reclaim_makes_one_reclaim(world: World, client_for: Any) -> None:
    client = client_for("provider")
    path = f"/api/nodes/{world.node.pk}/emergency-reclaim/"
    first, second = _post(client, path, None, "r-1"), _post(client, path, None, "r-1")
    assert first.status_code == second.status_code == 201 and first.json() == second.json()
    assert ReclaimEvent.objects.filter(node=world.node).count() == 1
    assert _post(client, path, None, "r-2").status_code == 409  # a new key: the node is reclaimed already


@pytest.mark.django_db(transaction=True)
def test_concurrent_twins_with_one_key_create_one_job() -> None:
    t = f.make_two_labs()
    user = t.users["researcher"]
    key = uuid.uuid4().hex

    def send() -> tuple[int, Any]:
        client = APIClient()
        client.force_authenticate(user)
        response = _post(client, "/api/jobs/", JOB, key)
        return response.status_code, response.json()

    answers = f.at_once(6, send)
    statuses = [status for status, _ in answers]
    bodies = [body for _, body in answers]
    assert statuses == [201] * 6
    assert all(body == bodies[0] for body in bodies)
    assert Job.objects.filter(name="retry-me").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_registrations_of_one_name_at_once_answer_201_and_400_never_500() -> None:
    t = f.make_two_labs()
    body = {"name": "twin-01", "building": t.building.pk, "gpus": [{"model": "RTX 3090"}]}

    def send() -> tuple[int, Any]:
        client = APIClient()
        client.force_authenticate(t.users["provider"])
        response = _post(client, "/api/nodes/", body, uuid.uuid4().hex)  # different keys: real twins
        return response.status_code, response.json()

    results = f.at_once(4, send)
    statuses = [status for status, _ in results]
    answers = [answer for _, answer in results]
    assert sorted(statuses) == [201, 400, 400, 400]
    assert all("name" in a for a, s in zip(answers, statuses, strict=True) if s == 400)
    assert Node.objects.filter(name="twin-01").count() == 1
