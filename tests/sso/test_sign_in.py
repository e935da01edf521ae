"""Campus sign-in end to end (docs/design.md §20): the portal and a real OpenID Connect provider (django-oauth-
toolkit, a second Django process) on loopback; the browser is a ``requests.Session``."""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.test import Client, override_settings

from portal.core.models import Provider, ResearchGroup
from portal.sso.backend import NOT_ADMITTED, CampusOIDCBackend
from portal.sso.models import CampusIdentity, ClaimRule, GrantKind, MatchKind, RuleGrant
from portal.sso.views import UNAVAILABLE
from tests.portal.factories import at_once
from tests.sso.conftest import IdentityProvider, Portal, campus_sign_in, free_port

User = get_user_model()


@pytest.fixture
def db(portal: Portal) -> None:
    """pytest-django's ``db``, replaced in this module: the database access the live portal opened for the
    module, no per-test transaction (the server's threads must see what a test writes)."""


@pytest.fixture(scope="module")
def campus(portal: Portal, django_db_blocker: Any) -> dict[str, Any]:
    with django_db_blocker.unblock():
        return {"lab": Provider.objects.create(name="Vision Lab", slug="vision-lab"),
                "group": ResearchGroup.objects.create(name="NLP Group", slug="nlp-group")}


@pytest.fixture
def rules(db: None, campus: dict[str, Any]) -> Iterator[list[ClaimRule]]:
    """groups ∋ vision-lab → Vision Lab; groups ∋ nlp → NLP Group; eduperson_affiliation ∋ staff → staff."""
    made = [
        ClaimRule.objects.create(position=10, claim="groups", value="vision-lab", action=GrantKind.LAB,
                                 provider=campus["lab"]),
        ClaimRule.objects.create(position=20, claim="groups", match=MatchKind.REGEX, value="nlp(-.*)?",
                                 action=GrantKind.GROUP, research_group=campus["group"]),
        ClaimRule.objects.create(position=30, claim="eduperson_affiliation", value="STAFF", ignore_case=True,
                                 action=GrantKind.STAFF),
    ]
    yield made
    ClaimRule.objects.all().delete()


def me(session: requests.Session, portal: Portal) -> requests.Response:
    return session.get(f"{portal.url}/api/me/", timeout=20)


def messages_of(page: requests.Response) -> str:
    return html.unescape(page.text)


def portal_csrf(session: requests.Session, portal: Portal) -> str:
    page = session.get(f"{portal.url}/accounts/login/", timeout=20)
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    return token


def test_first_sign_in_creates_the_account_with_the_mapped_roles(
        portal: Portal, idp: IdentityProvider, oidc_on: dict[str, Any], rules: list[ClaimRule],
        campus: dict[str, Any]) -> None:
    login_page = requests.get(f"{portal.url}/accounts/login/", timeout=20)
    assert "Sign in with Campus ID" in login_page.text and 'name="password"' in login_page.text  # both ways in

    idp.set_claims("ada", groups=["vision-lab", "nlp-2026"], eduperson_affiliation=["Staff"])
    _, answer = campus_sign_in(portal, "ada")
    assert answer.url == f"{portal.url}/api/me/", answer.url
    body = answer.json()
    assert body["username"] == "ada" and body["is_staff"] is True
    assert [p["name"] for p in body["providers"]] == ["Vision Lab"]
    assert [g["name"] for g in body["groups"]] == ["NLP Group"]

    user = User.objects.get(username="ada")
    assert user.email == "ada@campus.test" and not user.has_usable_password()
    identity = CampusIdentity.objects.get(user=user)
    assert identity.issuer == idp.issuer and identity.last_claims["groups"] == ["vision-lab", "nlp-2026"]
    assert sorted(g.kind for g in RuleGrant.objects.filter(user=user)) == ["group", "lab", "staff"]


def test_a_later_sign_in_reapplies_the_rules(portal: Portal, idp: IdentityProvider, oidc_on: dict[str, Any],
                                             rules: list[ClaimRule], campus: dict[str, Any]) -> None:
    lab, group = campus["lab"], campus["group"]
    idp.set_claims("bob", groups=["nlp"], eduperson_affiliation=["student"])
    _, answer = campus_sign_in(portal, "bob")
    assert answer.json()["roles"] == ["researcher"]
    bob = User.objects.get(username="bob")
    lab.members.add(bob)  # an admin adds bob to the lab by hand: no rule owns that membership

    idp.set_claims("bob", groups=["vision-lab"], eduperson_affiliation=["staff"])  # the directory changes
    _, answer = campus_sign_in(portal, "bob")
    assert answer.json()["is_staff"] is True
    bob.refresh_from_db()
    assert not group.members.filter(pk=bob.pk).exists(), "the rule that granted NLP Group no longer matches"
    assert lab.members.filter(pk=bob.pk).exists()
    assert not RuleGrant.objects.filter(user=bob, kind=GrantKind.LAB).exists(), "the lab membership stays manual"

    idp.set_claims("bob", groups=[], eduperson_affiliation=["alum"])  # nothing maps any more: refused
    session, answer = campus_sign_in(portal, "bob")
    assert answer.url == f"{portal.url}/accounts/login/" and NOT_ADMITTED in messages_of(answer)
    assert me(session, portal).status_code == 401
    bob.refresh_from_db()
    assert bob.is_staff is False, "the staff flag a rule gave is withdrawn"
    assert lab.members.filter(pk=bob.pk).exists(), "the manual membership is kept"
    assert not RuleGrant.objects.filter(user=bob).exists()


def test_sign_out_ends_the_portal_and_the_campus_session(portal: Portal, idp: IdentityProvider,
                                                         oidc_on: dict[str, Any], rules: list[ClaimRule]) -> None:
    session, answer = campus_sign_in(portal, "erin")
    assert answer.json()["username"] == "erin"
    out = session.post(f"{portal.url}/accounts/logout/", data={"csrfmiddlewaretoken": portal_csrf(session, portal)},
                       timeout=20)
    visited = [r.url for r in out.history] + [out.url]
    assert any(url.startswith(f"{idp.issuer}/logout/?id_token_hint=") for url in visited), visited
    assert out.url == f"{portal.url}/accounts/login/"
    assert me(session, portal).status_code == 401
    # The provider's session ended too: signing in again asks for the password.
    again = session.get(f"{portal.url}/oidc/authenticate/", timeout=20)
    assert again.url.startswith(f"http://127.0.0.1:{idp.issuer.split(':')[2].split('/')[0]}/accounts/login/")
    assert 'name="password"' in again.text


def test_sign_in_that_no_rule_maps_is_refused(portal: Portal, idp: IdentityProvider, oidc_on: dict[str, Any],
                                              rules: list[ClaimRule]) -> None:
    session, answer = campus_sign_in(portal, "carol")
    assert answer.url == f"{portal.url}/accounts/login/"
    assert NOT_ADMITTED in messages_of(answer)
    assert not User.objects.filter(email="carol@campus.test").exists()
    assert not CampusIdentity.objects.filter(last_claims__preferred_username="carol").exists()
    assert me(session, portal).status_code == 401


def test_campus_name_never_takes_over_a_local_account_and_passwords_still_work(
        portal: Portal, idp: IdentityProvider, oidc_on: dict[str, Any], rules: list[ClaimRule]) -> None:
    local = User.objects.create_user("dave", email="dave@elsewhere.test", password="local-password-1")
    _, answer = campus_sign_in(portal, "dave")
    assert answer.json()["username"] == "dave-2"
    assert CampusIdentity.objects.get(subject__isnull=False, user__username="dave-2")
    assert not CampusIdentity.objects.filter(user=local).exists()

    session = requests.Session()
    token = portal_csrf(session, portal)
    page = session.post(f"{portal.url}/accounts/login/", timeout=20, data={
        "csrfmiddlewaretoken": token, "username": "dave", "password": "local-password-1", "next": "/api/me/"})
    assert page.json()["username"] == "dave"
    assert requests.post(f"{portal.url}/api/auth/token/", data={"username": "dave", "password": "local-password-1"},
                         timeout=20).status_code == 200


def test_two_first_sign_ins_at_once_make_one_account(oidc_on: dict[str, Any], rules: list[ClaimRule]) -> None:
    """Two callbacks of one new person committing together: one account, one identity, both signed in to it."""
    claims = {"sub": "race-1", "iss": oidc_on["RECLAIMNET_OIDC_ISSUER"], "preferred_username": "race",
              "groups": ["nlp"]}

    def sign_in() -> int:
        backend = CampusOIDCBackend()
        backend.request = HttpRequest()
        return backend.sign_in(dict(claims)).pk

    first, second = at_once(2, sign_in)
    assert first == second
    assert CampusIdentity.objects.filter(subject="race-1").count() == 1
    assert list(User.objects.filter(username__startswith="race").values_list("username", flat=True)) == ["race"]
    assert RuleGrant.objects.filter(user_id=first).count() == 1


def test_provider_down_is_a_message_not_an_error(portal: Portal, oidc_on: dict[str, Any]) -> None:
    with override_settings(RECLAIMNET_OIDC_ISSUER=f"http://127.0.0.1:{free_port()}/o"):
        answer = requests.get(f"{portal.url}/oidc/authenticate/", timeout=20)
    assert answer.url == f"{portal.url}/accounts/login/" and UNAVAILABLE in messages_of(answer)


def test_off_unless_configured(portal: Portal, db: None) -> None:
    assert requests.get(f"{portal.url}/oidc/authenticate/", timeout=20, allow_redirects=False).status_code == 404
    assert "Sign in with" not in requests.get(f"{portal.url}/accounts/login/", timeout=20).text


def test_admin_refuses_a_rule_with_a_bad_regular_expression(db: None, campus: dict[str, Any]) -> None:
    admin = User.objects.create_superuser("rules-admin", password="x-password-1")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/sso/claimrule/add/", {
        "position": 1, "enabled": "on", "claim": "groups", "match": "regex", "value": "(unclosed",
        "action": "group", "research_group": campus["group"].pk, "note": ""})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["value"] and "Not a valid regular expression" in errors["value"][0]
    assert not ClaimRule.objects.exists()

    response = client.post("/admin/sso/claimrule/add/", {
        "position": 1, "enabled": "on", "claim": "groups", "match": "equals", "value": "nlp", "action": "lab",
        "note": ""})
    assert list(response.context["adminform"].form.errors) == ["provider"]
    response = client.post("/admin/sso/claimrule/add/", {
        "position": 1, "enabled": "on", "claim": "groups", "match": "regex", "value": "nlp-[0-9]+",
        "action": "group", "research_group": campus["group"].pk, "note": ""})
    assert response.status_code == 302 and ClaimRule.objects.get().value == "nlp-[0-9]+"
    ClaimRule.objects.all().delete()
