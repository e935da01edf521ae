"""What the researcher and provider pages read per request (docs/design.md §10 "CPU per request"): each role
question once, a node's GPUs and lending windows once, and a long run of checkpoints listed newest first up to
``CHECKPOINT_ROWS`` with a link to all of them."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.web.views.researcher import CHECKPOINT_ROWS
from tests.portal import factories as f
from tests.web.conftest import Campus

pytestmark = pytest.mark.django_db

ROLE_TABLES = ('"core_provider_members"', '"core_researchgroup_members"')


def _statements(client: Client, path: str) -> list[str]:
    client.get(path)  # whatever a first request caches (the session, content types)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return [q["sql"] for q in captured.captured_queries]


@pytest.mark.parametrize(("role", "path"), [("researcher", "/jobs/"), ("researcher", "/jobs/{job}/"),
                                            ("provider", "/provider/"), ("provider", "/provider/nodes/{node}/")])
def test_a_page_asks_each_role_question_once(campus: Campus, client_as: Callable[[str | None], Client],
                                             role: str, path: str) -> None:
    statements = _statements(client_as(role), path.format(job=campus.job.pk, node=campus.node.pk))
    for table in ROLE_TABLES:
        role_checks = [sql for sql in statements if sql.startswith("SELECT") and ' AS "a" FROM ' in sql
                       and table in sql]
        assert len(role_checks) <= 1, (path, table, role_checks)


def test_a_node_page_reads_its_gpus_and_lending_windows_once(
        campus: Campus, client_as: Callable[[str | None], Client]) -> None:
    statements = _statements(client_as("provider"), f"/provider/nodes/{campus.node.pk}/")
    assert not [sql for sql in statements if sql.startswith("SELECT COUNT(*)") and '"core_gpu"' in sql]
    assert len([sql for sql in statements if sql.startswith('SELECT "core_gpu"')]) == 1
    assert len([sql for sql in statements if sql.startswith('SELECT "core_lendingwindow"')]) == 1


def test_a_long_run_of_checkpoints_lists_the_newest_with_a_link_to_all(
        campus: Campus, client_as: Callable[[str | None], Client]) -> None:
    total = CHECKPOINT_ROWS + 5
    for sequence in range(2, total + 1):  # the campus has checkpoint #1
        f.make_checkpoint(campus.job, campus.node, sequence=sequence, completed_ago_s=300 - sequence)
    client = client_as("researcher")
    page = client.get(f"/jobs/{campus.job.pk}/?fragment=timeline").content.decode()
    assert f"Checkpoints #1 to #{total} ({total})" in page
    assert page.count("<tr><td>") == CHECKPOINT_ROWS
    assert f"<tr><td>{total}</td>" in page and "<tr><td>5</td>" not in page  # the newest, not the oldest
    assert f"Show all {total}" in page and "?checkpoints=all#timeline" in page
    everything = client.get(f"/jobs/{campus.job.pk}/?fragment=timeline&checkpoints=all").content.decode()
    assert everything.count("<tr><td>") == total and "Show all" not in everything
    assert "checkpoints=all" in everything  # its live refresh keeps listing all


def test_a_short_run_of_checkpoints_lists_every_one_without_a_link(
        campus: Campus, client_as: Callable[[str | None], Client]) -> None:
    f.make_checkpoint(campus.job, campus.node, sequence=2, completed_ago_s=200)
    page = client_as("researcher").get(f"/jobs/{campus.job.pk}/").content.decode()
    assert page.count("<tr><td>") == 2 and "Show all" not in page


def test_the_jobs_page_lists_one_page_of_the_newest_with_links_to_older_and_newer(
        campus: Campus, client_as: Callable[[str | None], Client]) -> None:
    """A group that submitted hundreds of jobs reads one page of them per look (design §10), and every job is
    still reachable page by page, each once."""
    from portal.core.models import Job
    from portal.web.views.researcher import JOBS_PER_PAGE

    for i in range(2 * JOBS_PER_PAGE):
        f.make_job(campus.group, campus.users["researcher"], name=f"burst-{i}")
    client = client_as("researcher")
    every = set(Job.objects.filter(group=campus.group).values_list("pk", flat=True))
    seen: list[int] = []
    page, pages = 1, 0
    while page:
        html = client.get(f"/jobs/?page={page}").content.decode()
        listed = [int(pk) for pk in re.findall(r'href="/jobs/(\d+)/"', html)]
        assert len(listed) <= JOBS_PER_PAGE
        seen += listed
        pages += 1
        older = re.search(r'href="\?state=&amp;page=(\d+)" rel="next"', html)
        assert ('rel="prev"' in html) == (page > 1)
        page = int(older.group(1)) if older else 0
    assert sorted(seen) == sorted(every) and len(seen) == len(every)
    assert pages == -(-len(every) // JOBS_PER_PAGE)
    assert seen[0] == max(every)  # newest first


@pytest.mark.parametrize("query", ["page=%C2%B2", "page=99999999999999999999", "page=-1", "page=0", "page=x",
                                   "array=99999999999999999999", "array=%C2%B2", "state=%22%3E%3Cb%3E"])
def test_an_odd_page_array_or_state_in_the_query_shows_the_newest_jobs_and_never_a_server_error(
        campus: Campus, client_as: Callable[[str | None], Client], query: str) -> None:
    """A superscript digit ("²".isdigit() is true, int("²") fails), a page or array id past the database's
    integer, or markup in ``state``: the page answers 200 with the newest jobs and echoes nothing of it back."""
    job = f.make_job(campus.group, campus.users["researcher"], name="the-newest")
    response = client_as("researcher").get(f"/jobs/?{query}")
    html = response.content.decode()
    assert response.status_code == 200
    assert f'href="/jobs/{job.pk}/"' in html and "<b>" not in html and "99999999999999999999" not in html
