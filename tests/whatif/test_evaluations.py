"""What-if evaluations through the API and the pages: uploads refused naming the field, staff only, and an
evaluation run eagerly (the outbox relayed inline) producing the report of the chosen policies (design §7)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from portal.core.models import OutboxMessage
from portal.whatif import services
from portal.whatif.models import Evaluation
from scheduler.sim.trace import save, to_json_obj
from scheduler.sim.tracegen import GenConfig, generate
from tests.portal import factories as f
from tests.whatif.conftest import History

API = "/api/whatif/evaluations/"
TINY = GenConfig(days=1.0, n_jobs=4, total_gpu_h=20.0, departures=4, node_scale=0.1, drift_start_day=0.5,
                 drift_days=0.25)


@pytest.fixture(scope="module")
def tiny_rows() -> dict[str, Any]:
    return to_json_obj(generate(TINY))


@pytest.fixture
def users(db: Any) -> dict[str, Any]:
    return {"admin": f.make_user("wi-staff", staff=True, password=f.PASSWORD),
            "researcher": f.make_user("wi-user", password=f.PASSWORD)}


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _zip(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buf.getvalue()


def _csv_members(rows: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    from scheduler.sim.trace import from_rows

    folder = tmp_path / "csv"
    save(from_rows(rows), folder)
    return {p.name: p.read_text() for p in folder.iterdir()}


def _post_upload(client: APIClient, data: bytes, name: str, **fields: Any) -> Any:
    body = {"source": "upload", "policies": ["reclaimnet"], "seeds": ["0"],
            "trace": SimpleUploadedFile(name, data), **fields}
    return client.post(API, body, format="multipart")


def test_bad_uploads_answer_400_naming_the_field(users: dict[str, Any], tiny_rows: dict[str, Any],
                                                 tmp_path: Path) -> None:
    client = _api(users["admin"])
    # not JSON at all
    r = _post_upload(client, b"nodes,links\n1,2\n", "trace.json")
    assert r.status_code == 400 and r.json()["field"] == "trace" and "JSON" in r.json()["detail"]
    # a negative duration
    bad = json.loads(json.dumps(tiny_rows))
    bad["jobs"][1]["work_s"] = -5
    r = _post_upload(client, json.dumps(bad).encode(), "trace.json")
    assert r.status_code == 400 and r.json()["field"] == "jobs.work_s", r.json()
    # a missing column, in the CSV folder as a zip: named with its member
    members = _csv_members(tiny_rows, tmp_path)
    lines = members["jobs.csv"].splitlines()
    header = lines[0].split(",")
    drop = header.index("ckpt_bytes")
    members["jobs.csv"] = "\n".join(",".join(c for k, c in enumerate(line.split(",")) if k != drop)
                                    for line in lines) + "\n"
    r = _post_upload(client, _zip(members), "trace.zip")
    assert r.status_code == 400, r.json()
    assert r.json()["field"] == "jobs.ckpt_bytes" and r.json()["file"] == "jobs.csv"
    # a member whose path escapes the archive
    evil = dict(_csv_members(tiny_rows, tmp_path))
    evil["../../etc/nodes.csv"] = evil.pop("nodes.csv")
    r = _post_upload(client, _zip(evil), "trace.zip")
    assert r.status_code == 400 and r.json()["field"] == "trace" and "outside" in r.json()["detail"]
    # a zip bomb: declared sizes over the limit are refused before anything is inflated
    r = _post_upload(client, _zip({"nodes.csv": "0" * (65 * 2**20)}), "bomb.zip")
    assert r.status_code == 400 and r.json()["field"] == "trace" and "uncompressed" in r.json()["detail"]
    # unknown policy, bad seed, bad days
    r = client.post(API, {"source": "history", "policies": ["nope"], "seeds": [0]}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "policies"
    r = client.post(API, {"source": "history", "policies": ["static"], "seeds": [-1]}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "seeds"
    r = client.post(API, {"source": "history", "policies": ["static"], "days": 0}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "days"
    # a body that is not JSON at all (fuzz-found: DRF's parse error had no "field", which the schema requires)
    r = client.post(API, b"\n\xff", content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "body" and "JSON parse error" in r.json()["detail"]
    assert not Evaluation.objects.exists() and not OutboxMessage.objects.filter(task_name=services.TASK).exists()


def test_a_good_zip_is_accepted_and_queued_on_the_evaluation_queue(users: dict[str, Any], tiny_rows: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    from django.conf import settings

    members = {f"trace/{k}": v for k, v in _csv_members(tiny_rows, tmp_path).items()}  # one folder is fine
    r = _post_upload(_api(users["admin"]), _zip(members), "campus.zip", seeds=["0", "1"])
    assert r.status_code == 201, r.json()
    ev = Evaluation.objects.get(pk=r.json()["id"])
    assert ev.state == "queued" and ev.seeds == [0, 1] and ev.trace_name == "campus.zip"
    stored = ev.trace_rows()["jobs"]
    assert {j["group"] for j in stored} == {"default"}  # the loader's default group, written out
    assert [{k: v for k, v in j.items() if k != "group"} for j in stored] == tiny_rows["jobs"]
    assert OutboxMessage.objects.get(task_name=services.TASK).args == [ev.pk]
    assert settings.CELERY_TASK_ROUTES[services.TASK] == {"queue": "evaluation"}


def test_non_staff_are_refused_on_the_api_and_the_pages(users: dict[str, Any]) -> None:
    researcher = _api(users["researcher"])
    assert researcher.get(API).status_code == 403
    assert researcher.post(API, {"source": "history", "policies": ["static"]}, format="json").status_code == 403
    ev = Evaluation.objects.create(source="history", history_days=1, policies=["static"], seeds=[0])
    assert researcher.get(f"{API}{ev.pk}/").status_code == 403
    assert researcher.get(f"{API}{ev.pk}/report/").status_code == 403
    assert APIClient().get(API).status_code in (401, 403)
    page = Client()
    page.force_login(users["researcher"])
    for url in ("/whatif/", f"/whatif/{ev.pk}/", f"/whatif/{ev.pk}/progress.json", f"/whatif/{ev.pk}/report.csv"):
        assert page.get(url).status_code == 403, url
    assert page.post("/whatif/", {"source": "history", "policies": ["static"], "seeds": "0"}).status_code == 403
    assert Evaluation.objects.count() == 1
    assert Client().get("/whatif/").status_code == 302  # anonymous: to the sign-in page


def test_the_page_shows_a_form_error_naming_the_field(users: dict[str, Any], tiny_rows: dict[str, Any]) -> None:
    page = Client()
    page.force_login(users["admin"])
    bad = json.loads(json.dumps(tiny_rows))
    bad["jobs"][0]["restart_s"] = -1
    r = page.post("/whatif/", {"source": "upload", "policies": ["static"], "seeds": "0",
                               "trace": SimpleUploadedFile("t.json", json.dumps(bad).encode())})
    assert r.status_code == 400
    assert b"jobs.restart_s" in r.content and b'data-field="trace"' in r.content
    r = page.post("/whatif/", {"source": "history", "policies": ["static"], "seeds": "0,x"})
    assert r.status_code == 400 and b'data-field="seeds"' in r.content
    assert not Evaluation.objects.exists()


def test_an_evaluation_runs_eagerly_and_reports_the_chosen_policies(
        users: dict[str, Any], tiny_rows: dict[str, Any], settings: Any,
        django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.RECLAIMNET_OUTBOX_RELAY = "inline"
    seen: list[float] = []
    real = services.compare

    def watching(trace: Any, policies: Any, seeds: Any, progress: Any = None) -> Any:
        def spy(frac: float, label: str) -> None:
            seen.append(frac)
            progress(frac, label)
        return real(trace, policies, seeds, progress=spy)

    monkeypatch.setattr(services, "compare", watching)
    monkeypatch.setattr(services, "PROGRESS_EVERY_S", 0.0)
    client = _api(users["admin"])
    with django_capture_on_commit_callbacks(execute=True):
        r = _post_upload(client, json.dumps(tiny_rows).encode(), "tiny.json", policies=["static", "reclaimnet"],
                         seeds=["0", "3"])
    assert r.status_code == 201, r.json()
    ev = Evaluation.objects.get(pk=r.json()["id"])
    assert ev.state == "done", ev.error
    assert ev.progress == 1.0 and ev.started_at and ev.finished_at
    assert seen and seen == sorted(seen) and seen[-1] == 1.0
    report = client.get(f"{API}{ev.pk}/").json()["report"]
    assert [row["policy"] for row in report["table"]] == ["static", "reclaimnet"]
    assert {(run["policy"], run["seed"]) for run in report["runs"]} == {
        ("static", 0), ("static", 3), ("reclaimnet", 0), ("reclaimnet", 3)}
    assert {p["policy"] for p in report["pareto"]} == {"static", "reclaimnet"}
    assert any(p["on_front"] for p in report["pareto"])
    assert {c["kind"] for c in report["classes"]} == {"group", "checkpoint"}
    assert report["trace"]["jobs"] == len(tiny_rows["jobs"])
    listed = client.get(API).json()
    assert listed["results"][0]["id"] == ev.pk and "report" not in listed["results"][0]
    csv_text = client.get(f"{API}{ev.pk}/report-csv/").content.decode()
    assert csv_text.splitlines()[0].startswith("policy,runs,work_lost_gpu_h") and len(csv_text.splitlines()) == 3
    assert client.get(f"{API}{ev.pk}/report-csv/", {"table": "nope"}).json()["field"] == "table"
    assert client.get(f"{API}{ev.pk}/report/").json()["policies"] == ["static", "reclaimnet"]
    page = Client()
    page.force_login(users["admin"])
    html = page.get(f"/whatif/{ev.pk}/").content.decode()
    assert 'data-testid="whatif-report"' in html and "<svg" in html and 'data-policy="reclaimnet"' in html
    svg = page.get(f"/whatif/{ev.pk}/pareto.svg")
    assert svg["Content-Type"] == "image/svg+xml" and b"<circle" in svg.content
    # a second delivery of the task does nothing
    assert services.run_evaluation(ev.pk) == "skipped"


def test_history_evaluation_exports_then_runs(history: History, settings: Any,
                                              django_capture_on_commit_callbacks: Any) -> None:
    settings.RECLAIMNET_OUTBOX_RELAY = "inline"
    with django_capture_on_commit_callbacks(execute=True):
        r = _api(history.admin).post(API, {"source": "history", "days": 3, "policies": ["slurm-pr"]}, format="json")
    assert r.status_code == 201, r.json()
    ev = Evaluation.objects.get(pk=r.json()["id"])
    assert ev.state == "done", ev.error
    assert ev.report["trace"]["jobs"] == 4 and ev.report["trace"]["reclaims"] == 3
    assert ev.trace_rows()["nodes"][0]["id"] == "wi-east-01"


def test_a_stale_running_evaluation_is_marked_failed(users: dict[str, Any]) -> None:
    import datetime as dt

    from django.utils import timezone

    ev = Evaluation.objects.create(source="history", history_days=1, policies=["static"], seeds=[0], state="running")
    Evaluation.objects.filter(pk=ev.pk).update(updated_at=timezone.now() - dt.timedelta(seconds=services.STALE_S + 5))
    assert services.expire_stale() == 1
    ev.refresh_from_db()
    assert ev.state == "failed" and "no progress" in ev.error


def test_the_report_page_says_in_words_which_simpler_policy_lost_less(users: dict[str, Any]) -> None:
    """design §7.1 "When ReclaimNet would lose": the page names the policy and the setting."""
    table = [{"policy": "reclaimnet", "runs": 1, "work_lost_gpu_h": 12.0},
             {"policy": "static-10min", "runs": 1, "work_lost_gpu_h": 10.0}]
    ev = Evaluation.objects.create(source="history", history_days=1, policies=["reclaimnet", "static-10min"],
                                   seeds=[0], state="done", report={"table": table, "pareto": [], "classes": []})
    page = Client()
    page.force_login(users["admin"])
    html = page.get(f"/whatif/{ev.pk}/").content.decode()
    assert 'data-testid="whatif-simpler-wins"' in html
    assert "static-10min loses less work than ReclaimNet: 10.00 against 12.00 GPU-h" in html
    assert "RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S = 600" in html
    table[1]["work_lost_gpu_h"] = 13.0
    Evaluation.objects.filter(pk=ev.pk).update(report={"table": table, "pareto": [], "classes": []})
    html = page.get(f"/whatif/{ev.pk}/").content.decode()
    assert 'data-testid="whatif-simpler-wins"' not in html and "no policy in this report lost less" in html
