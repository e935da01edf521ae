"""``GET /api/jobs/{id}/output/`` and the job page's Output panel (design §9.11): the tail of a job's output, read
whole or followed with ``since``, visible exactly as the job is, documented in the schema."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.control.link import output
from portal.core.models import Job, JobOutput
from portal.core.models.output import OUTPUT_CAP_BYTES
from tests.portal import factories as f
from tests.portal.conftest import World


def _write(world: World, text: str) -> None:
    assert output.append_report(world.node.pk, {"job_id": world.job.pk, "text": text}) is None


@pytest.fixture
def placed(world: World) -> World:
    f.place_job(world.job, world.node)
    return world


def _get(client: Any, job_id: int, since: Any = None) -> Any:
    query = {} if since is None else {"since": since}
    return client.get(f"/api/jobs/{job_id}/output/", query)


def test_the_group_reads_the_output_then_follows_only_what_is_new(placed: World, client_for: Any) -> None:
    client = client_for("researcher")
    empty = _get(client, placed.job.pk).json()
    assert empty == {"text": "", "offset": 0, "next_offset": 0, "truncated": 0, "running": True,
                     "size_cap_bytes": OUTPUT_CAP_BYTES}
    _write(placed, "epoch 1 loss 0.91\n")
    first = _get(client, placed.job.pk).json()
    assert first["text"] == "epoch 1 loss 0.91\n" and first["next_offset"] == 18 and first["offset"] == 0
    _write(placed, "epoch 2 loss λ=0.5\n")
    second = _get(client, placed.job.pk, since=first["next_offset"]).json()
    assert second["text"] == "epoch 2 loss λ=0.5\n" and second["offset"] == 18
    assert second["next_offset"] == 18 + len("epoch 2 loss λ=0.5\n".encode()) and second["truncated"] == 0
    idle = _get(client, placed.job.pk, since=second["next_offset"]).json()
    assert idle["text"] == "" and idle["next_offset"] == second["next_offset"]


def test_following_with_nothing_new_is_one_read_and_with_news_one_more(placed: World, client_for: Any) -> None:
    client = client_for("researcher")
    for k in range(30):
        _write(placed, f"line {k}\n")
    end = JobOutput.objects.get(pk=placed.job.pk).end_offset
    with CaptureQueriesContext(connection) as idle:
        assert _get(client, placed.job.pk, since=end).status_code == 200
    _write(placed, "new\n")
    with CaptureQueriesContext(connection) as news:
        assert _get(client, placed.job.pk, since=end).json()["text"] == "new\n"
    assert len(idle.captured_queries) == 1 and len(news.captured_queries) == 2
    assert "core_joboutputchunk" in news.captured_queries[1]["sql"].lower()


def test_a_reader_behind_the_cap_is_told_how_many_bytes_were_dropped(placed: World, client_for: Any) -> None:
    block = "z" * 99 + "\n"
    for _ in range(3 * OUTPUT_CAP_BYTES // 10_000):
        _write(placed, block * 100)
    head = JobOutput.objects.get(pk=placed.job.pk)
    answer = _get(client_for("researcher"), placed.job.pk, since=10).json()
    assert answer["offset"] == head.start_offset > 10 and answer["truncated"] == head.start_offset - 10
    assert len(answer["text"].encode()) == head.end_offset - head.start_offset <= OUTPUT_CAP_BYTES


def test_the_output_stays_after_the_job_ends(placed: World, client_for: Any) -> None:
    _write(placed, "done\n")
    Job.objects.filter(pk=placed.job.pk).update(state="completed")
    answer = _get(client_for("researcher"), placed.job.pk).json()
    assert answer["text"] == "done\n" and answer["running"] is False


@pytest.mark.parametrize("since", ["abc", "-1", "", "1.5", str(2**63)])
def test_a_bad_since_answers_400_naming_it(placed: World, client_for: Any, since: str) -> None:
    response = _get(client_for("researcher"), placed.job.pk, since=since)
    assert response.status_code == 400 and set(response.json()) == {"since"}


def test_since_beyond_the_end_answers_400_with_what_to_send(placed: World, client_for: Any) -> None:
    _write(placed, "abc\n")
    response = _get(client_for("researcher"), placed.job.pk, since=5)
    assert response.status_code == 400
    assert "4 bytes so far" in response.json()["since"][0]


@pytest.mark.parametrize("role, status", [("researcher", 200), ("admin", 200), ("other_researcher", 404),
                                          ("provider", 404), ("other_provider", 404), ("outsider", 404),
                                          (None, 401)])
def test_only_the_jobs_group_and_admins_read_its_output(placed: World, client_for: Any, role: str | None,
                                                       status: int) -> None:
    _write(placed, "secret hyperparameters\n")
    response = _get(client_for(role), placed.job.pk)
    assert response.status_code == status
    assert ("secret" in response.content.decode()) is (status == 200)


def test_an_unknown_job_answers_404(world: World, client_for: Any) -> None:
    assert _get(client_for("admin"), 999_999).status_code == 404


@pytest.mark.django_db
def test_the_schema_documents_the_output_endpoint(tmp_path: Any) -> None:
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out))
    operation = yaml.safe_load(out.read_text())["paths"]["/api/jobs/{id}/output/"]["get"]
    assert {"200", "400", "401", "404"} <= set(operation["responses"])
    since = next(p for p in operation["parameters"] if p["name"] == "since")
    assert since["in"] == "query" and since["schema"]["minimum"] == 0
    body = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    spec = yaml.safe_load(out.read_text())
    fields = set(spec["components"]["schemas"][body]["properties"])
    assert fields == {"text", "offset", "next_offset", "truncated", "running", "size_cap_bytes"}


# --- the job page's Output panel ------------------------------------------------------------------------------
def _page_client(world: World, role: str) -> Client:
    client = Client()
    client.force_login(world.users[role])
    return client


def test_the_job_page_shows_the_output_escaped_with_its_live_refresh(placed: World) -> None:
    _write(placed, "<script>alert('x')</script> & done\n")
    page = _page_client(placed, "researcher").get(f"/jobs/{placed.job.pk}/").content.decode()
    assert 'id="job-output"' in page and f'data-live="job-{placed.job.pk}"' in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; done" in page
    assert "<script>alert(" not in page
    assert "Output capped" not in page


def test_the_output_fragment_says_when_earlier_lines_were_dropped(placed: World) -> None:
    for _ in range(3 * OUTPUT_CAP_BYTES // 10_000):
        _write(placed, ("q" * 99 + "\n") * 100)
    _write(placed, "the newest line\n")
    fragment = _page_client(placed, "researcher").get(f"/jobs/{placed.job.pk}/output/").content.decode()
    assert fragment.lstrip().startswith('<section id="job-output"')
    assert "Output capped: earlier lines dropped" in fragment and "the newest line" in fragment


@pytest.mark.parametrize("role", ["other_researcher", "provider"])
def test_another_groups_member_gets_no_output_fragment(placed: World, role: str) -> None:
    _write(placed, "secret\n")
    assert _page_client(placed, role).get(f"/jobs/{placed.job.pk}/output/").status_code == 404


def test_a_job_that_has_not_started_says_so(world: World) -> None:
    fragment = _page_client(world, "researcher").get(f"/jobs/{world.job.pk}/output/").content.decode()
    assert "The job has not started yet" in fragment
