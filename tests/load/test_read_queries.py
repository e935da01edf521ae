"""The reads ``make load`` drives issue a fixed number of SQL statements, whatever the campus's size.

Two campuses built like the tick benchmark's (``scripts/tickcampus.py``), 50 and 200 nodes (2 and 8 buildings,
running jobs, a week of reclaims, bandwidth samples); each read is sent once as an admin (the one who sees
everything) and its statements counted with Django's query capture. The counts must be equal: a per-node, per-job
or per-building query anywhere in a read would make the 200-node count larger (as
tests/control/test_tick_queries.py pins the control tick's).
"""

from __future__ import annotations

from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from portal.control import ladder
from portal.core.models import Job, Node
from portal.web import dashboard
from tests.load.conftest import tickcampus

READS = ["/api/nodes/", "/api/nodes/{node}/", "/api/jobs/", "/api/jobs/{job}/", "/api/reclaims/", "/api/summary/",
         "/dashboard/", "/dashboard/charts.json", "/dashboard/?fragment=summary",
         "/jobs/", "/jobs/{job}/", "/provider/", "/provider/nodes/{node}/"]

pytestmark = pytest.mark.django_db


class _Undo(Exception):  # noqa: N818
    pass


def _statements(n_nodes: int) -> dict[str, list[str]]:
    """{read: its SQL statements} on a campus of ``n_nodes``, rolled back afterwards.

    The class ladder's per-process cache (``ladder.CACHE_S``, 5 s) is held for the capture: filled by one read's
    warm-up, it could expire just before another's counted request and add its one statement there (seen on a
    busy machine: ``/jobs/{job}/`` 17 statements at 50 nodes, 18 at 200)."""
    with mock.patch.object(ladder, "CACHE_S", float("inf")):
        ladder.clear_cache()
        return _statements_now(n_nodes)


def _statements_now(n_nodes: int) -> dict[str, list[str]]:
    try:
        with transaction.atomic():
            tickcampus().build(n_nodes, samples_per_link=5)
            admin = get_user_model().objects.create_superuser("load-admin", password="x")
            client = Client()
            client.force_login(admin)
            node, job = Node.objects.order_by("pk").first(), Job.objects.order_by("pk").first()
            assert node is not None and job is not None
            out = {}
            for read in READS:
                path = read.format(node=node.pk, job=job.pk)
                client.get(path)  # the session, the content types: whatever a first request caches
                with CaptureQueriesContext(connection) as captured:
                    response = client.get(path)
                assert response.status_code == 200, (path, response.status_code)
                out[read] = [q["sql"][:160] for q in captured.captured_queries]
            with CaptureQueriesContext(connection) as captured:
                dashboard.build()
            out["dashboard.build()"] = [q["sql"][:160] for q in captured.captured_queries]
            raise _Undo(out)
    except _Undo as done:
        return dict(done.args[0])


@override_settings(RECLAIMNET_DASHBOARD_MAX_AGE_S=0)  # computed on every request, as the statements are counted
def test_every_read_issues_as_many_statements_at_200_nodes_as_at_50() -> None:
    small, large = _statements(50), _statements(200)
    # A list counts its rows only when its page is full (portal/core/api/pagination.py): 200 nodes fill the
    # 100-row page, 50 do not. That one COUNT(*) is not per node; every other statement must match.
    for statements in (small, large):
        for read in ("/api/nodes/", "/api/jobs/", "/api/reclaims/"):
            counts = [sql for sql in statements[read] if sql.startswith('SELECT COUNT(*) AS "__count"')]
            assert len(counts) <= 1, (read, counts)
            statements[read] = [sql for sql in statements[read] if sql not in counts]
    grew = {read: (len(small[read]), len(large[read])) for read in [*READS, "dashboard.build()"]
            if len(small[read]) != len(large[read])}
    detail = "\n".join(f"{read}: {len(small[read])} -> {len(large[read])}\n  " + "\n  ".join(large[read])
                       for read in grew)
    assert not grew, f"statements grow with the campus: {grew}\n{detail}"


# The pages' statements as an admin on the 200-node campus (design §10 "CPU per request"): each role question
# once per request, a node's GPUs and windows once, a job's shown checkpoints' copies in two statements and its
# placements and migrations once for the status and the timeline (12 for the job page, plus one per panel the
# loans, the fair queue and the results add: activity, eviction, queue entry, output, results), a job list's open
# placements in one.
PAGE_STATEMENTS = {"/jobs/": 5, "/jobs/{job}/": 17, "/provider/": 9, "/provider/nodes/{node}/": 9}


@override_settings(RECLAIMNET_DASHBOARD_MAX_AGE_S=0)
def test_the_pages_issue_no_more_statements_than_pinned() -> None:
    large = _statements(200)
    over = {read: len(large[read]) for read, most in PAGE_STATEMENTS.items() if len(large[read]) > most}
    assert not over, f"{over}\n" + "\n".join(f"{read}:\n  " + "\n  ".join(large[read]) for read in over)
