"""What a researcher sees is true: work done moves with real progress (design §9.9), a request
no node could ever run is refused at submit naming the field, a command and an image together are refused, the
request card says "any" for no minimum, and P1's minimum interval reaches the agents (design §2)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.control.link.handlers import HeartbeatSeen, record_heartbeats
from portal.control.progress import CheckpointPoint, seconds_per_step
from portal.control.state import remaining_s
from portal.core.models import Checkpoint, DecisionLog, Job, Placement
from portal.core.services import jobs as job_services
from tests.portal import factories as f
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db

SUBMIT = {"name": "vit-large", "gpu_count": 1, "expected_runtime_s": 3600, "ckpt_bytes_estimate": 3_200_000_000,
          "command": "python train.py"}
FORM = {"name": "vit-large", "gpu_count": "1", "vram_gb_per_gpu": "16", "min_capability": "7.0",
        "framework": "pytorch", "command": "python train.py", "image": "", "expected_runtime_h": "4",
        "ckpt_gb": "3.2", "loss_budget_min": "", "restart_s": "30", "priority_class": "standard"}


def beat(job: Job, node_id: int, step: int, at: dt.datetime) -> None:
    """One heartbeat of ``node_id`` reporting ``job`` at ``step``, recorded as the consumer records them."""
    msg: Any = {"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {},
                "jobs": [{"job_id": job.pk, "step": step}]}
    assert record_heartbeats([HeartbeatSeen(node_id, None, None, at, msg)]) == []


def checkpoint(job: Job, node_id: int, sequence: int, step: int, taken_at: dt.datetime) -> None:
    Checkpoint.objects.create(job=job, node_id=node_id, sequence=sequence, step=step, size_bytes=10**9,
                              sha256="0" * 64, taken_at=taken_at, completed_at=taken_at)


@pytest.fixture
def api(world: World) -> Callable[[str], APIClient]:
    def make(role: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(world.users[role])
        return client

    return make


# --- work done from real progress ---------------------------------------------------------------------------------


def test_work_done_is_the_run_time_of_a_new_job_and_moves_with_each_heartbeat(world: World) -> None:
    now = timezone.now()
    f.place_job(world.job, world.node, started_at=now - dt.timedelta(seconds=100))
    beat(world.job, world.node.pk, 50, now)
    job = Job.objects.get(pk=world.job.pk)
    assert job.progress_step == 50 and job.work_done_s == pytest.approx(100.0, abs=0.01)
    beat(world.job, world.node.pk, 60, now + dt.timedelta(seconds=20))
    job = Job.objects.get(pk=world.job.pk)
    assert job.progress_step == 60 and job.work_done_s == pytest.approx(120.0, abs=0.01)
    assert remaining_s(job) == pytest.approx(3600.0 - 120.0, abs=0.01)


def test_work_done_uses_the_checkpoint_pace_once_the_run_wrote_two(world: World) -> None:
    now = timezone.now()
    f.place_job(world.job, world.node, started_at=now - dt.timedelta(seconds=300))  # 200 s of start-up
    checkpoint(world.job, world.node.pk, 1, 100, now - dt.timedelta(seconds=100))
    checkpoint(world.job, world.node.pk, 2, 200, now - dt.timedelta(seconds=50))  # 0.5 s per step
    beat(world.job, world.node.pk, 300, now)
    assert Job.objects.get(pk=world.job.pk).work_done_s == pytest.approx(150.0)


def test_a_migration_keeps_the_work_done_and_subtracts_the_work_lost(world: World) -> None:
    """The old run wrote steps 100 and 200 (0.5 s a step) and reached 260; the job resumed from step 200 on the
    other node: 60 steps (30 s) were lost, 100 s of work survive, and it goes on from there."""
    now = timezone.now()
    old = f.place_job(world.job, world.node, started_at=now - dt.timedelta(seconds=500))
    checkpoint(world.job, world.node.pk, 1, 100, now - dt.timedelta(seconds=400))
    checkpoint(world.job, world.node.pk, 2, 200, now - dt.timedelta(seconds=350))
    beat(world.job, world.node.pk, 260, now - dt.timedelta(seconds=320))
    assert Job.objects.get(pk=world.job.pk).work_done_s == pytest.approx(130.0)
    Placement.objects.filter(pk=old.pk).update(ended_at=now - dt.timedelta(seconds=60), end_reason="migrated")
    Placement.objects.create(job=world.job, node=world.other_node, gpu_indices=[0])
    Placement.objects.filter(job=world.job, ended_at__isnull=True).update(started_at=now - dt.timedelta(seconds=30))
    Job.objects.filter(pk=world.job.pk).update(progress_step=200)  # job_started: resumed from checkpoint 2
    beat(world.job, world.other_node.pk, 210, now)
    job = Job.objects.get(pk=world.job.pk)
    assert job.progress_step == 210 and job.work_done_s == pytest.approx(105.0)
    assert remaining_s(job) == pytest.approx(3600.0 - 105.0)


def test_the_api_shows_work_done_as_heartbeats_arrive(world: World, api: Callable[[str], APIClient]) -> None:
    now = timezone.now()
    f.place_job(world.job, world.node, started_at=now - dt.timedelta(seconds=40))
    before = api("researcher").get(f"/api/jobs/{world.job.pk}/").json()
    assert before["work_done_s"] == 0.0
    beat(world.job, world.node.pk, 12203, now)
    after = api("researcher").get(f"/api/jobs/{world.job.pk}/").json()
    assert after["progress_step"] == 12203 and after["work_done_s"] == pytest.approx(40.0, abs=0.01)


def test_recording_progress_costs_two_statements_whatever_the_jobs_and_checkpoints(world: World) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.control.progress import record_progress

    now = timezone.now()
    jobs = [world.job, *(f.make_job(world.group, world.users["researcher"]) for _ in range(4))]
    for job in jobs:
        f.place_job(job, world.node, started_at=now - dt.timedelta(seconds=100))
        for k in range(1, 8):
            checkpoint(job, world.node.pk, k, 10 * k, now - dt.timedelta(seconds=100 - 10 * k))
    for reports in ({world.job.pk: (75, now)}, {job.pk: (75, now) for job in jobs}):
        with CaptureQueriesContext(connection) as captured:
            assert record_progress(reports) == len(reports)
        assert len(captured.captured_queries) == 2
    assert [j.work_done_s for j in Job.objects.filter(pk__in=[j.pk for j in jobs])] == [pytest.approx(75.0)] * 5


def test_pace_is_never_measured_across_a_move() -> None:
    """Two checkpoints written on different nodes span the downtime between them (600 s for 10 steps): not a
    pace. The run that resumed from step 100 and reached step 120 in 50 s is."""
    start = timezone.now()
    points = [CheckpointPoint(1, 100, start, 1), CheckpointPoint(2, 110, start + dt.timedelta(seconds=600), 2)]
    run = start + dt.timedelta(seconds=590)
    assert seconds_per_step(120, run + dt.timedelta(seconds=50), run, points) == pytest.approx(50 / 20)
    assert seconds_per_step(120, run + dt.timedelta(seconds=50), None, points) is None  # no run, no pair


# --- requests no node could ever run ------------------------------------------------------------------------------


def test_api_refuses_more_gpus_than_any_node_has_naming_the_field(world: World, api: Callable[[str], APIClient]
                                                                   ) -> None:
    response = api("researcher").post("/api/jobs/", SUBMIT | {"gpu_count": 6}, format="json")
    assert response.status_code == 400
    assert response.json() == {"gpu_count": ["No node on this campus has 6 GPUs; the largest has 2."]}
    assert not Job.objects.filter(name="vit-large").exists()


def test_api_refuses_vram_and_capability_above_any_gpu_at_once(world: World, api: Callable[[str], APIClient]
                                                               ) -> None:
    response = api("researcher").post("/api/jobs/", SUBMIT | {"vram_gb_per_gpu": 500, "min_capability": "9.5"},
                                      format="json")
    assert response.status_code == 400
    assert response.json() == {
        "vram_gb_per_gpu": ["No GPU on this campus has 500 GB of memory; the largest has 24 GB."],
        "min_capability": ["No GPU on this campus has compute capability 9.5 or higher; the highest is 8.6."],
    }


def test_a_request_that_fits_a_node_not_lent_now_is_accepted_and_waits(world: World,
                                                                       api: Callable[[str], APIClient]) -> None:
    f.make_node(world.lab, world.building, name="a100-box", gpus=4, model="A100")  # registered, not online
    response = api("researcher").post("/api/jobs/", SUBMIT | {"gpu_count": 4, "vram_gb_per_gpu": 80,
                                                              "min_capability": "8.0"}, format="json")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).state == "queued"


SHARED_SNAPSHOTS = {"CACHES": {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                           "LOCATION": "campus-hardware-test"}},
                    "RECLAIMNET_DASHBOARD_MAX_AGE_S": 5.0, "RECLAIMNET_DASHBOARD_REFRESH_S": 10.0}


def test_a_fitting_submit_reads_the_shared_hardware_snapshot_and_a_refusal_reads_the_database(
        world: World) -> None:
    """A burst of submits reads the campus's hardware once per snapshot; a node registered since the snapshot
    is never missed: a refusal is confirmed on the database itself (design §10 "CPU per request")."""
    researcher = world.users["researcher"]
    with override_settings(**SHARED_SNAPSHOTS):
        cache.clear()
        job_services.submit_job(researcher, group=world.group, **SUBMIT | {"name": "first"})  # fills the snapshot
        with CaptureQueriesContext(connection) as fitting:
            job_services.submit_job(researcher, group=world.group, **SUBMIT | {"name": "second"})
        f.make_node(world.lab, world.building, name="a100-box", gpus=4, model="A100")  # after the snapshot
        job = job_services.submit_job(researcher, group=world.group, **SUBMIT | {"name": "big", "gpu_count": 4})
        with pytest.raises(ValidationError) as refused:
            job_services.submit_job(researcher, group=world.group, **SUBMIT | {"name": "huge", "gpu_count": 8})
    assert not any('"core_gpu"' in q["sql"] for q in fitting.captured_queries)
    assert job.gpu_count == 4 and job.state == "queued"
    assert refused.value.message_dict == {"gpu_count": ["No node on this campus has 8 GPUs; the largest has 4."]}


def test_retired_nodes_do_not_count(world: World) -> None:
    f.make_node(world.lab, world.building, name="old-box", gpus=8, state="retired")
    with pytest.raises(ValidationError) as refused:
        job_services.submit_job(world.users["researcher"], group=world.group, **SUBMIT | {"gpu_count": 8})
    assert refused.value.message_dict == {"gpu_count": ["No node on this campus has 8 GPUs; the largest has 2."]}


def test_gpus_that_fit_only_on_different_nodes_are_refused(world: World) -> None:
    f.make_node(world.lab, world.building, name="a6000-box", gpus=1, model="RTX A6000")  # 48 GB, 8.6
    f.make_node(world.lab, world.building, name="ada-box", gpus=1, model="RTX 4090")  # 24 GB, 8.9
    researcher = world.users["researcher"]
    with pytest.raises(ValidationError) as both:
        job_services.submit_job(researcher, group=world.group,
                                **SUBMIT | {"vram_gb_per_gpu": 48, "min_capability": "8.9"})
    assert both.value.message_dict == {"vram_gb_per_gpu": [
        "No node on this campus has GPUs with both 48 GB of memory and compute capability 8.9; "
        "lower one of the two."]}
    with pytest.raises(ValidationError) as gang:
        job_services.submit_job(researcher, group=world.group, **SUBMIT | {"gpu_count": 2, "vram_gb_per_gpu": 48})
    assert gang.value.message_dict == {"gpu_count": [
        "No node on this campus has 2 GPUs with at least 48 GB; the most on one node is 1."]}


def test_a_campus_with_no_nodes_yet_accepts_any_request(db: Any) -> None:
    user = f.make_user()
    group = f.make_group(members=(user,))
    job = job_services.submit_job(user, group=group, **SUBMIT | {"gpu_count": 16, "vram_gb_per_gpu": 500,
                                                                 "priority_class": "best_effort"})  # no class limit
    assert job.state == "queued"


def test_form_refuses_an_impossible_request_on_its_field(world: World) -> None:
    client = Client()
    client.force_login(world.users["researcher"])
    response = client.post("/jobs/new/", FORM | {"group": world.group.pk, "gpu_count": "6"})
    assert response.status_code == 400
    assert response.context["form"].errors == {"gpu_count": ["No node on this campus has 6 GPUs; the largest has 2."]}
    assert not Job.objects.filter(name="vit-large").exists()


def test_form_tells_what_the_campus_has(world: World) -> None:
    client = Client()
    client.force_login(world.users["researcher"])
    html = client.get("/jobs/new/").content.decode()
    assert "the largest here has 2" in html and "the largest GPU here has 24 GB" in html


# --- a command and an image ---------------------------------------------------------------------------------------

BOTH = "Give a command or a container image, not both: the job would run only the command. Clear one of the two."


def test_api_refuses_a_command_and_an_image_together(world: World, api: Callable[[str], APIClient]) -> None:
    response = api("researcher").post("/api/jobs/", SUBMIT | {"image": "registry.campus/nlp/train:1.4"},
                                      format="json")
    assert response.status_code == 400
    assert response.json() == {"image": [BOTH]}


def test_form_refuses_a_command_and_an_image_together(world: World) -> None:
    client = Client()
    client.force_login(world.users["researcher"])
    response = client.post("/jobs/new/", FORM | {"group": world.group.pk, "image": "registry.campus/nlp/train:1.4"})
    assert response.status_code == 400
    assert response.context["form"].errors == {"image": [BOTH]}


def test_service_refuses_a_command_and_an_image_together(world: World) -> None:
    with pytest.raises(ValidationError) as refused:
        job_services.submit_job(world.users["researcher"], group=world.group, **SUBMIT | {"image": "img:1"})
    assert refused.value.message_dict == {"image": [BOTH]}


# --- the request card ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("vram", "capability", "shown"), [
    (0, "0", "1 × any GPU"),
    (24, "0", "1 × ≥ 24 GB, capability any"),
    (0, "8.0", "1 × any memory, capability ≥ 8.0"),
    (40.5, "8.6", "1 × ≥ 40.5 GB, capability ≥ 8.6"),
])
def test_request_card_says_any_for_no_minimum(world: World, vram: float, capability: str, shown: str) -> None:
    Job.objects.filter(pk=world.job.pk).update(vram_gb_per_gpu=vram, min_capability=capability)
    client = Client()
    client.force_login(world.users["researcher"])
    html = client.get(f"/jobs/{world.job.pk}/").content.decode()
    assert f'<dd data-testid="gpu-request">{shown}</dd>' in html


# --- P1's minimum interval in the portal --------------------------------------------------------------------------


@pytest.mark.parametrize("floor_s", [60.0, 0.0])
def test_p1_tick_tells_a_tiny_checkpoint_the_minimum_interval(world: World, settings: Any, floor_s: float) -> None:
    from portal.control.loop.ticks import p1_tick

    settings.RECLAIMNET = {**settings.RECLAIMNET, "MIN_CHECKPOINT_INTERVAL_S": floor_s}
    Job.objects.filter(pk=world.job.pk).update(ckpt_bytes_estimate=2500)
    f.place_job(world.job, world.node)
    assert p1_tick() == 1
    job = Job.objects.get(pk=world.job.pk)
    decision = DecisionLog.objects.get(kind="p1", job=job)
    assert decision.request["min_interval_s"] == floor_s
    if floor_s:
        assert job.checkpoint_interval_s == 60.0
        assert decision.response["jobs"][0]["interval_s"] == 60.0
    else:
        assert job.checkpoint_interval_s < 5.0  # the paper's Eq. 9 alone: a checkpoint every few seconds


def test_an_image_alone_is_refused_because_agents_run_commands(world: World) -> None:
    """No agent runs container images: a job given only an image would fail at its first start, so it is
    refused at submit on the ``image`` field with what to do instead."""
    with pytest.raises(ValidationError) as refused:
        job_services.submit_job(world.users["researcher"], group=world.group,
                                **SUBMIT | {"command": "", "image": "img:1"})
    assert list(refused.value.message_dict) == ["image"]
    assert "give the command" in refused.value.message_dict["image"][0]
