"""What people read is plain words: refusals without enum reprs, no "C/B + Tr", singular and plural forms,
lending windows in a few words, relative times the page keeps moving, where a checkpoint was really copied,
model names in Django admin, the admin's own labels, a favicon."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.apps import apps
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from portal.control.models import Transfer, TransferPurpose, TransferState
from portal.core.lifecycle.base import InvalidTransition
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.labels import degraded_reason_words, refusal
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import LendingWindow, Migration, Node, Provider
from portal.core.services import nodes as node_services
from portal.web.forms import RegisterNodeForm
from portal.web.templatetags.reclaimnet import ago, copies, lending_summary
from tests.portal import factories as f
from tests.portal.conftest import World

NOUN_S = re.compile(r"\b(job|gpu|node|window|field|checkpoint|reclaim|migration|transfer|lab|group|copy|"
                    r"day|hour|minute|second)\(s\)", re.IGNORECASE)
ENUM_REPR = re.compile(r"(NodeState|JobState|ReclaimKind|ReclaimOutcome|MigrationMode|TextChoices)\.|<\w+\.\w+: ")


def _page_client(world: World, role: str) -> Client:
    client = Client()
    client.force_login(world.users[role])
    return client


# --- refusals (409 and page messages) ------------------------------------------------------------------------


@pytest.mark.parametrize(("machine", "states"), [("node", NodeState), ("job", JobState)])
def test_every_refusal_reads_as_a_sentence_without_enum_text(machine: str, states: Any) -> None:
    for current in states:
        for target in states:
            text = str(InvalidTransition(machine, current, target))
            assert not ENUM_REPR.search(text), text
            assert text.startswith(f"The {machine} is ") and text.endswith("."), text
            assert not re.search(r"'[a-z_]+'", text), text  # no quoted state values
            assert "_" not in text, text


def test_refusal_says_what_the_person_can_do_instead() -> None:
    text = refusal("node", "draining", NodeState.DRAINING, subject="vision-01")
    assert text == ("vision-01 is being drained for a reclaim with notice, so it cannot be reclaimed with notice. "
                    "An emergency reclaim or the kill-switch takes it back now.")
    assert refusal("node", NodeState.ONLINE, NodeState.OFFLINE).endswith("Only a reclaimed node can be lent again.")


def test_api_409_names_the_state_in_words(world: World, client_for: Any, dispatch_spy: Any) -> None:
    client = client_for("provider")
    url = f"/api/nodes/{world.node.pk}/reclaim/"
    assert client.post(url, {"notice_s": 120}, format="json").status_code == 201
    again = client.post(url, {"notice_s": 120}, format="json")
    assert again.status_code == 409
    body = again.json()
    assert "being drained" in body["detail"] and "emergency reclaim" in body["detail"]
    assert body["state"] == [body["detail"]]
    assert not ENUM_REPR.search(again.content.decode()) and "'draining'" not in again.content.decode()


def test_api_409_on_lend_again_of_a_lent_node(world: World, client_for: Any) -> None:
    answer = client_for("provider").post(f"/api/nodes/{world.node.pk}/lend-again/", format="json")
    assert answer.status_code == 409
    assert answer.json()["detail"] == ("The node is online and lent, so it cannot be lent again. "
                                       "Only a reclaimed node can be lent again.")


def test_page_refusal_names_the_node_in_words(world: World, dispatch_spy: Any) -> None:
    client = _page_client(world, "provider")
    url = f"/provider/nodes/{world.node.pk}/reclaim/confirm/"
    client.post(url, {"notice_s": "120"})
    page = client.post(url, {"notice_s": "120"}, follow=True)
    text = page.content.decode()
    assert "vision-01 is being drained for a reclaim with notice, so it cannot be reclaimed with notice." in text
    assert not ENUM_REPR.search(text)


def test_degraded_reasons_read_as_words(world: World) -> None:
    for reason in ("killswitch", "emergency", "heartbeat_lost", "deadline", "notice", "cap", "capacity",
                   "transfer failed", "agent restarted", "requeued"):
        words = degraded_reason_words(reason)
        assert words and words != reason and "_" not in words
    Migration.objects.create(job=world.job, source=world.node, mode="degraded", degraded_reason="killswitch")
    page = _page_client(world, "researcher").get(f"/jobs/{world.job.pk}/").content.decode()
    assert "(kill-switch, no notice)" in page and "(killswitch)" not in page


# --- the reclaim dialog ---------------------------------------------------------------------------------------


def test_reclaim_dialog_explains_time_to_leave_in_words(world: World) -> None:
    f.place_job(world.job, world.node)
    f.make_checkpoint(world.job, world.node, size_bytes=2_000_000_000, completed_ago_s=60)
    page = _page_client(world, "provider").get(f"/provider/nodes/{world.node.pk}/reclaim/").content.decode()
    assert "C/B" not in page and "T<sub>r</sub>" not in page
    assert re.search(r"about [0-9][^<]* to write a checkpoint, send it and restart", page), page


# --- singular and plural ------------------------------------------------------------------------------------


def test_one_gpu_is_singular_and_two_are_plural(world: World) -> None:
    client = _page_client(world, "admin")
    one = client.get(f"/provider/nodes/{world.other_node.pk}/?fragment=state").content.decode()
    two = client.get(f"/provider/nodes/{world.node.pk}/?fragment=state").content.decode()
    assert "<span>GPU, " in one and "GPUs" not in one.replace("GPU floor", "")
    assert "<span>GPUs, " in two


def test_a_node_that_is_not_lent_says_so(world: World) -> None:
    client = _page_client(world, "provider")
    assert "GPUs, 2 lent" in client.get(f"/provider/nodes/{world.node.pk}/?fragment=state").content.decode()
    Node.objects.filter(pk=world.node.pk).update(state="reclaimed")
    state = client.get(f"/provider/nodes/{world.node.pk}/?fragment=state").content.decode()
    row = client.get("/provider/?fragment=nodes").content.decode()
    assert "GPUs, none lent now" in state and "none lent now, floor 0" in row and "2 lent" not in state


def test_floor_error_counts_gpus_in_words(db: Any) -> None:
    form = RegisterNodeForm({"gpu_count": 1, "gpu_floor": 2}, providers=Provider.objects.none())
    form.is_valid()
    assert form.errors["gpu_floor"] == ["The floor cannot exceed the node's 1 GPU."]


def test_no_template_or_message_says_s_in_brackets() -> None:
    """"job(s)", "GPU(s)": every count is written singular or plural (Django's pluralize / ngettext)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "portal"
    offenders = []
    for path in [*root.rglob("*.html"), *root.rglob("*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NOUN_S.search(line) and "log." not in line and "/migrations/" not in str(path):
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert offenders == []


# --- lending windows ----------------------------------------------------------------------------------------


def _windows(*rows: tuple[int, str, str]) -> list[LendingWindow]:
    return [LendingWindow(weekday=d, start_time=dt.time.fromisoformat(a), end_time=dt.time.fromisoformat(b))
            for d, a, b in rows]


@pytest.mark.parametrize(("rows", "words"), [
    ((), "always"),
    (tuple((d, "18:00", "08:00") for d in range(5)), "weekdays 18:00–08:00"),
    (tuple((d, "00:00", "23:59") for d in range(7)), "every day 00:00–23:59"),
    (((5, "10:00", "14:00"), (6, "10:00", "14:00")), "weekends 10:00–14:00"),
    (((0, "19:00", "07:00"), (1, "19:00", "07:00"), (2, "19:00", "07:00"), (4, "19:00", "07:00"),
      (5, "09:00", "17:00")), "Mon–Wed, Fri 19:00–07:00; Sat 09:00–17:00"),
    (((3, "08:00", "09:00"), (4, "08:00", "09:00")), "Thu, Fri 08:00–09:00"),
])
def test_lending_windows_in_a_few_words(rows: tuple[tuple[int, str, str], ...], words: str) -> None:
    assert lending_summary(_windows(*rows)) == words


def test_node_list_shows_lending_windows(world: World) -> None:
    node_services.set_lending_windows(world.node, world.users["provider"], [
        {"weekday": d, "start_time": dt.time(18), "end_time": dt.time(8)} for d in range(5)])
    client = _page_client(world, "admin")
    page = client.get("/provider/?fragment=nodes").content.decode()
    vision = page[page.index('id="node-' + str(world.node.pk) + '"'):]
    robotics = page[page.index('id="node-' + str(world.other_node.pk) + '"'):]
    assert re.search(r'data-testid="lending">weekdays 18:00–08:00<', vision)
    assert re.search(r'data-testid="lending">always<', robotics)
    node_page = client.get(f"/provider/nodes/{world.node.pk}/").content.decode()
    assert "weekdays 18:00–08:00" in node_page


def test_window_errors_get_the_summary_the_floor_errors_get(world: World) -> None:
    client = _page_client(world, "provider")
    form = {"gpu_floor": "0", "w-TOTAL_FORMS": "2", "w-INITIAL_FORMS": "0", "w-MIN_NUM_FORMS": "0",
            "w-MAX_NUM_FORMS": "21", "w-0-weekday": "2", "w-0-start_time": "09:00", "w-0-end_time": "09:00",
            "w-1-weekday": "3", "w-1-start_time": "", "w-1-end_time": "10:00"}
    answer = client.post(f"/provider/nodes/{world.node.pk}/settings/", form)
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "Please correct the 2 fields marked below." in page
    assert "A window must not start and end at the same time." in page
    floor_only = client.post(f"/provider/nodes/{world.node.pk}/settings/", {**form, "gpu_floor": "-1",
                             "w-TOTAL_FORMS": "0"}).content.decode()
    assert "Please correct the 1 field marked below." in floor_only


def test_service_window_messages_count_from_one(world: World) -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        node_services.set_lending_windows(world.node, world.users["provider"], [
            {"weekday": 0, "start_time": dt.time(9), "end_time": dt.time(9)}])
    assert caught.value.message_dict["lending_windows"] == ["Window 1: it must not start and end at the same time."]


# --- relative times -----------------------------------------------------------------------------------------


def test_ago_is_a_time_element_the_page_keeps_moving() -> None:
    when = timezone.now() - dt.timedelta(minutes=2, seconds=26)
    html = str(ago(when))
    match = re.fullmatch(r'<time datetime="([^"]+)" data-age-s="([0-9.]+)" title="[^"]+">2 min 26 s ago</time>', html)
    assert match, html
    assert dt.datetime.fromisoformat(match.group(1)) == when and 146 <= float(match.group(2)) < 147
    assert ago(None) == "never"


def test_every_page_loads_the_time_script_and_the_favicon(world: World) -> None:
    page = _page_client(world, "provider").get("/provider/").content.decode()
    assert '<script src="/static/reclaimnet/times.js" defer></script>' in page
    assert '<link rel="icon" href="/static/web/favicon.svg" type="image/svg+xml">' in page
    assert finders.find("reclaimnet/times.js") and finders.find("web/favicon.svg")


def test_favicon_ico_leads_to_the_svg(db: Any, client: Client) -> None:
    answer = client.get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"] == "/static/web/favicon.svg"


# --- where a checkpoint was copied ----------------------------------------------------------------------------


def _transfer(ckpt: Any, source: Node, destination: Node, state: str) -> Transfer:
    return Transfer.objects.create(job=ckpt.job, checkpoint=ckpt, source=source, destination=destination,
                                   purpose=TransferPurpose.PRESYNC, token_hash="0" * 64, state=state,
                                   expires_at=timezone.now() + dt.timedelta(minutes=5))


def test_checkpoint_copies_say_what_happened(world: World) -> None:
    f.place_job(world.job, world.node)
    kept = f.make_checkpoint(world.job, world.node, sequence=1, completed_ago_s=30)
    pruned = f.make_checkpoint(world.job, world.node, sequence=2, completed_ago_s=20)
    flying = f.make_checkpoint(world.job, world.node, sequence=3, completed_ago_s=10)
    never = f.make_checkpoint(world.job, world.node, sequence=4, completed_ago_s=5)
    _transfer(kept, world.node, world.other_node, TransferState.RECEIVED)
    kept.replica_nodes.add(world.other_node)
    _transfer(pruned, world.node, world.other_node, TransferState.RECEIVED)  # replica since dropped
    _transfer(flying, world.node, world.other_node, TransferState.ISSUED)
    assert copies(kept) == "copied to robotics-01"
    assert copies(pruned) == "was copied to robotics-01 (that copy has since been dropped)"
    assert copies(flying) == "being copied to robotics-01"
    assert copies(never) == "not copied to another node"
    page = _page_client(world, "researcher").get(f"/jobs/{world.job.pk}/").content.decode()
    assert "nowhere yet" not in page
    assert "was copied to robotics-01 (that copy has since been dropped)" in page


# --- admin labels -------------------------------------------------------------------------------------------


def test_every_model_has_a_correct_plural() -> None:
    wrong = re.compile(r"(ch|sh|x|ss|[^aeiou]y)s$|^gpus?$| gpus?$")
    for model in apps.get_models():
        if model._meta.app_label not in ("core", "control"):
            continue
        plural = str(model._meta.verbose_name_plural)
        assert not wrong.search(plural), (model.__name__, plural)
    assert apps.get_model("core", "Switch")._meta.verbose_name_plural == "switches"
    assert apps.get_model("core", "Gpu")._meta.verbose_name_plural == "GPUs"


def test_django_admin_lists_switches_and_gpus(world: World) -> None:
    page = _page_client(world, "admin").get("/admin/").content.decode()
    assert "Switches" in page and "GPUs" in page
    assert "Switchs" not in page and "Gpus" not in page and "availabilitys" not in page.lower()


def test_admin_pages_do_not_say_my(world: World) -> None:
    client = _page_client(world, "admin")
    for url, heading in (("/provider/", "Nodes"), ("/jobs/", "Jobs")):
        page = client.get(url).content.decode()
        assert f"<h1>{heading}</h1>" in page, url
        assert "My nodes" not in page and "My jobs" not in page, url
    provider = _page_client(world, "provider").get("/provider/").content.decode()
    assert "<h1>My nodes</h1>" in provider
