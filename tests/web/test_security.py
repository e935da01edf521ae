"""Security of the pages as a whole, derived from the URL table so that a new view cannot slip past:
login on every route, CSRF on every POST, no markup from user-typed names, settings saved all or nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern

from portal.core.models import Job, LendingWindow, ReclaimEvent
from portal.web import urls as web_urls
from tests.portal import factories as f
from tests.web.conftest import Campus

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'

# Views that change something; everything else in portal/web/urls.py only reads.
POST_ROUTES = {
    "node-settings", "node-token", "reclaim-confirm", "reclaim-emergency", "reclaim-killswitch",
    "node-lend-again", "job-cancel",
}


def _routes() -> list[URLPattern]:
    return [p for p in web_urls.urlpatterns if isinstance(p, URLPattern)]


def _url(pattern: URLPattern, campus: Campus) -> str:
    route = str(pattern.pattern)
    route = route.replace("<int:node_id>", str(campus.node.pk)).replace("<int:job_id>", str(campus.job.pk))
    route = route.replace("<slug:name>", "groups")
    assert "<" not in route, f"fill in the converter of {route}"
    return "/" + route


def test_post_routes_list_is_complete(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    """Every view that refuses GET is in POST_ROUTES (the CSRF test below covers exactly those)."""
    client = client_as("admin")
    post_only = {p.name for p in _routes() if client.get(_url(p, campus)).status_code == 405}
    assert post_only == POST_ROUTES


@pytest.mark.parametrize("name", [p.name for p in _routes() if p.name != "home"])
def test_every_route_needs_a_login(client_as: Callable[[str | None], Client], campus: Campus, name: str) -> None:
    pattern = next(p for p in _routes() if p.name == name)
    client = client_as(None)
    url = _url(pattern, campus)
    for response in (client.get(url), client.post(url, {"notice_s": "60", "confirm": "on"})):
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/"), url
    assert not ReclaimEvent.objects.exists()


def test_front_door_shows_only_the_sign_in_form(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    """``/`` answers visitors with the sign-in form and nothing else; a wrong password signs nobody in."""
    client = client_as(None)
    page = client.get("/")
    assert page.status_code == 200 and b'name="password"' in page.content
    assert campus.node.name.encode() not in page.content and campus.job.name.encode() not in page.content
    refused = client.post("/", {"username": "provider", "password": "wrong"})
    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    assert client.get("/provider/").status_code == 302
    user = campus.users["provider"]
    user.set_password(f.PASSWORD)
    user.save()
    signed_in = client.post("/", {"username": "provider", "password": f.PASSWORD})
    assert signed_in.status_code == 302 and client.get("/provider/").status_code == 200


@pytest.mark.parametrize("name", sorted(POST_ROUTES))
def test_every_post_needs_the_csrf_token(campus: Campus, name: str) -> None:
    pattern = next(p for p in _routes() if p.name == name)
    client = Client(enforce_csrf_checks=True)
    client.force_login(campus.users["researcher" if name == "job-cancel" else "provider"])
    data = {"notice_s": "60", "confirm": "on", "gpu_floor": "1", "w-TOTAL_FORMS": "0", "w-INITIAL_FORMS": "0"}
    assert client.post(_url(pattern, campus), data).status_code == 403
    assert not ReclaimEvent.objects.exists()
    campus.job.refresh_from_db()
    campus.node.refresh_from_db()
    assert campus.job.state == "running" and campus.node.state == "online" and campus.node.gpu_floor == 0


@pytest.mark.parametrize(
    ("role", "url"),
    [("provider", "/provider/"), ("provider", "/provider/nodes/{node}/"), ("provider", "/provider/nodes/{node}/reclaim/"),
     ("provider", "/provider/nodes/register/"), ("researcher", "/jobs/{job}/"), ("researcher", "/jobs/new/")],
)
def test_every_post_form_carries_the_csrf_token(
    client_as: Callable[[str | None], Client], campus: Campus, role: str, url: str
) -> None:
    html = client_as(role).get(url.format(node=campus.node.pk, job=campus.job.pk)).content.decode()
    forms = re.findall(r"<form[^>]*method=\"post\"[^>]*>(.*?)</form>", html, re.S | re.I)
    assert forms, url
    for body in forms:
        assert 'name="csrfmiddlewaretoken"' in body, body[:200]
    # htmx requests (live refresh, preview) send the token as a header too.
    assert re.search(r"hx-headers='\{\"X-CSRFToken\": \"[A-Za-z0-9]{64}\"\}'", html)


def test_names_people_type_are_never_markup(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    """Job, group and lab names end up in tables, the timeline, a confirm() dialog, charts and CSV."""
    Job.objects.filter(pk=campus.job.pk).update(name=XSS)
    campus.group.name = XSS
    campus.group.save()
    campus.lab.name = XSS
    campus.lab.save()
    pages = [
        ("researcher", "/jobs/"), ("researcher", f"/jobs/{campus.job.pk}/"),
        ("researcher", f"/jobs/{campus.job.pk}/?fragment=timeline"),
        ("provider", "/provider/"), ("provider", f"/provider/nodes/{campus.node.pk}/"),
        ("provider", f"/provider/nodes/{campus.node.pk}/reclaim/"), ("admin", "/dashboard/"),
    ]
    for role, url in pages:
        html = client_as(role).get(url).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html, url
        if "fragment" not in url:
            assert "&lt;script&gt;" in html or "\\u003Cscript\\u003E" in html, url  # it is shown, escaped


def test_a_blank_window_row_does_not_block_saving_the_floor(
    client_as: Callable[[str | None], Client], campus: Campus
) -> None:
    """What the browser sends from the node page as rendered: the one blank window row, left untouched."""
    client = client_as("provider")
    html = client.get(f"/provider/nodes/{campus.node.pk}/").content.decode()
    blank_day = re.search(r'<select name="w-0-weekday"[^>]*>.*?</select>', html, re.S)
    assert blank_day and re.search(r'<option value="" selected>', blank_day.group(0))
    data = {"gpu_floor": "1", "w-TOTAL_FORMS": "1", "w-INITIAL_FORMS": "0", "w-0-weekday": "",
            "w-0-start_time": "", "w-0-end_time": ""}
    response = client.post(f"/provider/nodes/{campus.node.pk}/settings/", data)
    assert response.status_code == 302
    campus.node.refresh_from_db()
    assert campus.node.gpu_floor == 1 and not LendingWindow.objects.filter(node=campus.node).exists()
    # A half-filled row is still refused, with the floor left as it was.
    data |= {"gpu_floor": "2", "w-0-start_time": "19:00"}
    response = client.post(f"/provider/nodes/{campus.node.pk}/settings/", data)
    assert response.status_code == 400
    assert response.context["windows"].errors[0].keys() == {"weekday", "end_time"}
    campus.node.refresh_from_db()
    assert campus.node.gpu_floor == 1


def test_settings_are_saved_all_or_nothing(
    client_as: Callable[[str | None], Client], campus: Campus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the service refuses the windows, the floor saved just before is rolled back."""
    from django.core.exceptions import ValidationError

    from portal.core.services import nodes as node_services

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ValidationError({"lending_windows": ["Windows overlap."]})

    monkeypatch.setattr(node_services, "set_lending_windows", refuse)
    data = {"gpu_floor": "2", "w-TOTAL_FORMS": "1", "w-INITIAL_FORMS": "0", "w-0-weekday": "0",
            "w-0-start_time": "19:00", "w-0-end_time": "07:00"}
    response = client_as("provider").post(f"/provider/nodes/{campus.node.pk}/settings/", data)
    assert response.status_code == 400 and b"Windows overlap." in response.content
    assert 'value="19:00"' in response.content.decode()
    campus.node.refresh_from_db()
    assert campus.node.gpu_floor == 0


def test_foreign_group_and_lab_streams_cannot_be_followed_by_form(campus: Campus) -> None:
    """``may_follow`` (the websocket's check) for group names a page could ask for."""
    from portal.web.access import may_follow

    researcher, provider = campus.users["researcher"], campus.users["provider"]
    assert may_follow(researcher, f"group-{campus.group.pk}")
    assert not may_follow(researcher, f"group-{campus.other_group.pk}")
    assert not may_follow(researcher, f"provider-{campus.lab.pk}")
    assert not may_follow(provider, f"provider-{campus.other_lab.pk}")
    assert not may_follow(provider, "dashboard")  # admins join it when they connect
    assert not may_follow(provider, f"job-{campus.other_job.pk}")
    other = f.make_job(campus.other_group, campus.users["other_researcher"])
    assert not may_follow(researcher, f"job-{other.pk}") and not may_follow(researcher, "job-abc")
