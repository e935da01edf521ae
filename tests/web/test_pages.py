"""Every page renders for the roles that use it; "/" sends each role to its own home; login is required."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from tests.web.conftest import Campus

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("role", "home"),
    [("admin", "/dashboard/"), ("provider", "/provider/"), ("researcher", "/jobs/")],
)
def test_home_redirects_by_role(client_as: Callable[[str | None], Client], role: str, home: str) -> None:
    response = client_as(role).get("/")
    assert response.status_code == 302
    assert response["Location"] == home


def test_user_without_role_gets_a_welcome_page(client_as: Callable[[str | None], Client]) -> None:
    response = client_as("outsider").get("/")
    assert response.status_code == 200
    assert b"not a member" in response.content


@pytest.mark.parametrize(
    "url", ["/provider/", "/provider/reclaims/", "/jobs/", "/jobs/new/", "/dashboard/",
            "/dashboard/export/groups.csv"]
)
def test_login_required_everywhere(client_as: Callable[[str | None], Client], url: str) -> None:
    response = client_as(None).get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_login_page_renders(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_provider_pages_render(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("provider")
    home = client.get("/provider/")
    assert home.status_code == 200
    assert b"vision-01" in home.content and b"robotics-01" not in home.content
    assert b"bert-finetune" in home.content  # the hosted job, with its checkpoint age
    # The age is a <time> element that frontend/src/times.js keeps moving (tests/portal/test_wording.py).
    assert b'checkpoint <time datetime="' in home.content and b">5 min ago</time>" in home.content
    for url in (
        f"/provider/nodes/{campus.node.pk}/",
        f"/provider/nodes/{campus.node.pk}/reclaim/",
        "/provider/nodes/register/",
        "/provider/reclaims/",
    ):
        assert client.get(url).status_code == 200, url


def test_researcher_pages_render(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("researcher")
    jobs = client.get("/jobs/")
    assert jobs.status_code == 200
    assert b"bert-finetune" in jobs.content and b"protein-fold" not in jobs.content
    job = client.get(f"/jobs/{campus.job.pk}/")
    assert job.status_code == 200
    assert b"Placed on vision-01" in job.content and b"Checkpoint #1" in job.content
    assert client.get("/jobs/new/").status_code == 200


def test_admin_sees_everything(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("admin")
    assert client.get("/dashboard/").status_code == 200
    nodes = client.get("/provider/").content
    assert b"vision-01" in nodes and b"robotics-01" in nodes
    assert client.get(f"/jobs/{campus.other_job.pk}/").status_code == 200


@pytest.mark.parametrize("fragment", ["nodes", "reclaims"])
def test_live_fragments_render_alone(client_as: Callable[[str | None], Client], fragment: str) -> None:
    response = client_as("provider").get(f"/provider/?fragment={fragment}", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert b"<html" not in response.content


def test_job_fragments(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("researcher")
    for fragment in ("status", "timeline"):
        response = client.get(f"/jobs/{campus.job.pk}/?fragment={fragment}")
        assert response.status_code == 200 and b"<html" not in response.content
    assert client.get(f"/jobs/{campus.job.pk}/?fragment=nope").status_code == 404


def test_nav_shows_only_the_roles_sections(client_as: Callable[[str | None], Client]) -> None:
    researcher = client_as("researcher").get("/jobs/").content
    assert b"My jobs" in researcher and b"My nodes" not in researcher and b"Dashboard" not in researcher
    provider = client_as("provider").get("/provider/").content
    assert b"My nodes" in provider and b"Submit a job" not in provider


def test_pages_use_local_assets_only(client_as: Callable[[str | None], Client]) -> None:
    """No CDN: every script and stylesheet comes from /static/."""
    html = client_as("admin").get("/dashboard/").content.decode()
    assert "/static/vendor/htmx.min.js" in html and "/static/vendor/chart.umd.min.js" in html
    assert "https://" not in html and "http://" not in html.replace('xmlns="http://', "")


def test_reclaim_history_is_newest_first(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from portal.core.models import ReclaimEvent

    now = timezone.now()
    newer = ReclaimEvent.objects.create(node=campus.node, kind="scheduled", notice_s=60, deadline_at=now)
    older = ReclaimEvent.objects.create(node=campus.node, kind="emergency", notice_s=0, deadline_at=now)
    ReclaimEvent.objects.filter(pk=older.pk).update(requested_at=now - timedelta(days=1))
    reclaims = list(client_as("provider").get("/provider/reclaims/").context["reclaims"])
    assert [r.pk for r in reclaims] == [newer.pk, older.pk]


def test_age_reads_naturally() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from portal.web.templatetags.reclaimnet import age

    now = timezone.now()
    assert age(None) == "never"
    assert age(now) == "just now"  # not "0.0 s ago"
    assert age(now - timedelta(seconds=5)).endswith("s ago")
    assert age(now - timedelta(minutes=5, seconds=1)) == "5 min 1 s ago"


def test_the_node_page_says_how_its_agent_runs_jobs(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    """Design §19.6: the agent's account from its hello; unconfined (allowed by its config) stands out."""
    from portal.core.models import Node

    client = client_as("provider")
    url = f"/provider/nodes/{campus.node.pk}/?fragment=state"
    assert b'data-testid="job-confinement"' not in client.get(url).content  # no hello yet: nothing to say
    Node.objects.filter(pk=campus.node.pk).update(
        job_confinement="confined: cgroup_v2 cgroups, as user nobody (uid 65534)")
    page = client.get(url).content.decode()
    assert "jobs run in cgroup_v2 cgroups, as user nobody (uid 65534)" in page and "stat warn" not in page
    Node.objects.filter(pk=campus.node.pk).update(job_confinement="unconfined: no usable cgroup hierarchy")
    page = client.get(url).content.decode()
    assert 'class="stat warn"' in page
    assert "jobs run unconfined (the agent's allow_unconfined_jobs): no usable cgroup hierarchy" in page
