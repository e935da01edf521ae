"""Work lost counts the steps no heartbeat reported (design §9.9): a SIGKILLed agent takes its jobs with it and
never reports how far they got after the last heartbeat the portal recorded — a heartbeat interval, or a whole
outage when the portal could not be reached. Each job's own progress record (``progress.json``: step and time)
outlives it; the restarted agent lists it in its hello (``ended_jobs``) and the portal measures from it.

tests/chaos found both errors this closes: an agent killed while daphne restarted recorded 0.0 s of work lost
for 4.2 s redone (the steps made during the outage were never heard), and a run with one checkpoint recorded
7.4 s for 4.5 s redone (its step time was taken over its whole placement, which outlived the run by the time
the portal took to hear it was gone). Runs below checkpoint and progress at 0.1 s per step.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from control_helpers import make_node, make_running_job

SHA = "e" * 64
STEP_S = 0.1
_ids = itertools.count()

db = pytest.mark.django_db(transaction=True)
pytestmark = [pytest.mark.timeout(60)]


def _handle(node: Any, kind: str, **fields: Any) -> None:
    from portal.control.link.handlers import handle

    handle(node.pk, kind, {"type": kind, "msg_id": f"u-{next(_ids)}", **fields})


def _hello(node: Any, ended: Any = None) -> dict[str, Any]:
    """The node's agent (re)connects running no job; ``ended``: what it found its predecessor's jobs got to."""
    from portal.control.link.handlers import hello, open_session

    session = open_session(node.pk, f"chan-{node.pk}-{next(_ids)}", "127.0.0.1")
    msg = {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
           "data_port": 9000 + node.pk, "jobs": []}
    if ended is not None:
        msg["ended_jobs"] = ended
    return dict(hello(node.pk, session, msg))


def _online(name: str) -> Any:
    node, _ = make_node(name)
    _hello(node)
    return node


def _run(job: Any, node: Any, started_s_ago: float, checkpoints: list[tuple[int, int, float]],
         holder: Any) -> dt.datetime:
    """Backdate the job's open placement on ``node``; give the run ``checkpoints`` (sequence, step, seconds after
    it started), each replicated to ``holder``. Returns when the run started."""
    from django.utils import timezone

    from portal.core.models import Checkpoint, Placement

    started = timezone.now() - dt.timedelta(seconds=started_s_ago)
    Placement.objects.filter(job=job, node=node, ended_at__isnull=True).update(started_at=started)
    for sequence, step, after_s in checkpoints:
        ckpt = Checkpoint.objects.create(job=job, sequence=sequence, node=node, step=step, size_bytes=1000,
                                         sha256=SHA, taken_at=started + dt.timedelta(seconds=after_s),
                                         completed_at=timezone.now())
        ckpt.replica_nodes.add(holder)
    return started


def _at(started: dt.datetime, after_s: float) -> float:
    return (started + dt.timedelta(seconds=after_s)).timestamp()


def _recover_and_start(src: Any, holder: Any, job: Any, sequence: int, step: int) -> Any:
    """The portal recovered the job the restarted agent no longer runs (the hello's outbox task, run inline in
    these tests); the holder's agent reports the start from checkpoint ``sequence``."""
    from portal.core.models import Migration, Placement

    assert Placement.objects.get(job=job, ended_at__isnull=True).node_id == holder.pk
    _handle(holder, "job_started", job_id=job.pk, restored_sequence=sequence, restored_step=step)
    return Migration.objects.filter(job=job).order_by("-started_at", "-pk").first()


@db
def test_an_agent_killed_while_unheard_records_the_steps_its_job_made_after_the_last_heartbeat() -> None:
    from portal.core.models import Job

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    _handle(src, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": 220}])
    # The portal restarts; meanwhile the job runs on to step 290, then its agent is SIGKILLed and restarted.
    _hello(src, [{"job_id": job.pk, "step": 290, "t": _at(started, 29.0)}])
    assert Job.objects.get(pk=job.pk).progress_step == 290
    mig = _recover_and_start(src, holder, job, 2, 200)
    assert mig.degraded_reason == "agent restarted" and mig.checkpoint.step == 200
    assert mig.work_lost_s == pytest.approx((290 - 200) * STEP_S, rel=0.01)


@db
def test_a_run_with_one_checkpoint_takes_its_step_time_from_it_to_the_progress_its_agent_left() -> None:
    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    # Started 60 s ago, one checkpoint at step 100 after 10 s, died at step 200 after 20 s: 0.1 s a step — not
    # the 60 s the placement lasted until the portal heard of it.
    started = _run(job, src, 60.0, [(1, 100, 10.0)], holder)
    _hello(src, [{"job_id": job.pk, "step": 200, "t": _at(started, 20.0)}])
    mig = _recover_and_start(src, holder, job, 1, 100)
    assert mig.work_lost_s == pytest.approx((200 - 100) * STEP_S, rel=0.01)


@db
def test_a_run_without_a_checkpoint_takes_its_step_time_up_to_the_progress_its_agent_left() -> None:
    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [], holder)
    _hello(src, [{"job_id": job.pk, "step": 200, "t": _at(started, 20.0)}])
    from portal.control.reclaim.workflow import measured_work_lost_s, old_run
    from portal.core.models import Placement

    Placement.objects.filter(job=job, node=src).update(ended_at=started + dt.timedelta(seconds=60))
    assert old_run(job, src.pk) is not None
    assert measured_work_lost_s(job, src.pk, 0, 200) == pytest.approx(200 * STEP_S, rel=0.01)


@db
def test_a_progress_record_older_than_the_run_on_the_node_is_not_taken_as_its_progress() -> None:
    from portal.core.models import Job

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    _handle(src, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": 220}])
    _hello(src, [{"job_id": job.pk, "step": 900, "t": _at(started, -5.0)}])  # an earlier run's file
    assert Job.objects.get(pk=job.pk).progress_step == 220
    mig = _recover_and_start(src, holder, job, 2, 200)
    assert mig.work_lost_s == pytest.approx((220 - 200) * STEP_S, rel=0.01)


@db
def test_malformed_ended_jobs_are_ignored_and_the_agent_is_still_welcomed() -> None:
    from portal.core.models import Job

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [(1, 100, 10.0)], holder)
    t = _at(started, 20.0)
    welcome = _hello(src, [
        "x", {"job_id": job.pk, "step": "999", "t": t}, {"job_id": True, "step": 999, "t": t},
        {"job_id": job.pk, "step": 999, "t": float("nan")}, {"job_id": job.pk, "step": -1, "t": t},
        {"job_id": job.pk, "step": 2**70, "t": t}, {"job_id": 10**9, "step": 999, "t": t}])
    assert welcome["type"] == "welcome"
    assert Job.objects.get(pk=job.pk).progress_step == 0
    assert _hello(src, {"not": "a list"})["type"] == "welcome"


@db
def test_an_agent_back_after_its_node_was_given_up_corrects_the_finished_migration_like_a_late_job_exited() -> None:
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick
    from portal.core.models import Migration, Node

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    _handle(src, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": 230}])
    Node.objects.filter(pk=src.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=3600))
    control_tick()  # heartbeat lost: resumed from the replica on the holder
    _handle(holder, "job_started", job_id=job.pk, restored_sequence=2, restored_step=200)
    mig = Migration.objects.get(job=job)
    assert mig.work_lost_s == pytest.approx((230 - 200) * STEP_S, rel=0.01)
    # The node's agent comes back much later: its job had got to step 260 before it died with it.
    _hello(src, [{"job_id": job.pk, "step": 260, "t": _at(started, 26.0)}])
    assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx((260 - 200) * STEP_S, rel=0.01)


@db
def test_a_run_paused_while_its_agent_could_not_hear_the_portal_does_not_count_the_pause_as_step_time() -> None:
    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    # 0.1 s a step, but paused (fenced, design §9.10) for 30 s between the checkpoints at steps 200 and 300.
    started = _run(job, src, 90.0, [(1, 100, 10.0), (2, 200, 20.0), (3, 300, 60.0), (4, 400, 70.0)], holder)
    _hello(src, [{"job_id": job.pk, "step": 450, "t": _at(started, 75.0)}])
    mig = _recover_and_start(src, holder, job, 2, 200)
    assert mig.work_lost_s == pytest.approx((450 - 200) * STEP_S, rel=0.01)


@db
def test_steps_a_cut_off_run_made_more_slowly_than_before_count_at_the_pace_they_were_made() -> None:
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick
    from portal.core.models import Migration, Node

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    started = _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)  # 0.1 s a step while heard ...
    _handle(src, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": 220}])
    Node.objects.filter(pk=src.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=3600))
    control_tick()  # cut off: given up, resumed from step 200 on the holder
    _handle(holder, "job_started", job_id=job.pk, restored_sequence=2, restored_step=200)
    # ... 0.15 s a step while cut off: the cut heals and the run's final report says step 300, reached at 35 s.
    _handle(src, "job_exited", job_id=job.pk, returncode=-9, step=300, result={}, reason="not placed here",
            step_at=_at(started, 35.0))
    assert Migration.objects.get(job=job).work_lost_s == pytest.approx(15.0, rel=0.01)


@db
def test_a_copy_whose_receiver_was_killed_before_reporting_it_is_concluded_by_the_receivers_next_hello() -> None:
    from portal.control.link.handlers import hello, open_session
    from portal.control.models import Transfer
    from portal.control.reclaim.workflow import issue_transfer
    from portal.core.models import Checkpoint

    src, holder, other = _online("src"), _online("holder"), _online("other")
    job = make_running_job(src)
    _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], other)
    arrived, lost = (issue_transfer(Checkpoint.objects.get(job=job, sequence=seq), src.pk, holder.pk, "presync",
                                    None) for seq in (1, 2))
    assert arrived is not None and lost is not None
    # The holder stored sequence 1 and was SIGKILLed before its transfer_received was answered; its next agent
    # lists what it holds. Sequence 2 never arrived: its copy stays open (the sender's report concludes it).
    session = open_session(holder.pk, "chan-holder-again", "127.0.0.1")
    hello(holder.pk, session, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                               "data_port": 9100, "jobs": [], "ended_jobs": [],
                               "checkpoints": [{"job_id": job.pk, "sequence": 1, "sha256": SHA}]})
    assert Transfer.objects.get(pk=arrived.pk).state == "received"
    assert holder.pk in Checkpoint.objects.get(job=job, sequence=1).replica_nodes.values_list("pk", flat=True)
    assert Transfer.objects.get(pk=lost.pk).state == "issued"


# --- the agent's side ------------------------------------------------------------------------------------------

def _agent(tmp_path: Path) -> Any:
    from nodeagent.agent import Agent
    from nodeagent.config import build_config

    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off"}, {})
    return Agent(cfg)


def _progress(data_dir: Path, job_id: str, content: bytes) -> None:
    work = data_dir / "jobs" / job_id / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "progress.json").write_bytes(content)


def test_a_restarted_agent_says_in_its_first_hello_how_far_its_predecessors_jobs_got() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        agent = _agent(Path(tmp))
        now = time.time()
        _progress(agent.data_dir, "7", json.dumps({"step": 290, "t": now - 2}).encode())
        _progress(agent.data_dir, "8", json.dumps({"step": 40, "t": now - 1}).encode())
        _progress(agent.data_dir, "9", json.dumps({"step": 5, "t": now - 3 * 86400}).encode())  # history
        _progress(agent.data_dir, "10", b"{not json")  # the job writes the file: never trusted
        _progress(agent.data_dir, "11", json.dumps({"step": True, "t": now}).encode())
        assert agent._hello()["ended_jobs"] == [{"job_id": 8, "step": 40, "t": now - 1},
                                                {"job_id": 7, "step": 290, "t": now - 2}]
        agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": 10.0, "jobs": []}, 0.0)
        assert "ended_jobs" not in agent._hello()  # recorded with the hello that was answered


# --- a run's pauses, as its agent reports them with its job_exited (design §9.9) --------------------------------

def _cut_off(src: Any, holder: Any, job: Any, sequence: int, step: int, heard_step: int) -> Any:
    """The portal last heard ``src`` at ``heard_step``, gives the node up and resumes the job from checkpoint
    ``sequence`` on the holder; returns the migration."""
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick
    from portal.core.models import Migration, Node

    _handle(src, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": heard_step}])
    Node.objects.filter(pk=src.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=3600))
    control_tick()
    _handle(holder, "job_started", job_id=job.pk, restored_sequence=sequence, restored_step=step)
    return Migration.objects.get(job=job, source=src)


def _moved_to(job: Any, source: Any, destination: Any, started: dt.datetime, sequence: int) -> None:
    """The job's run on ``source`` ended at ``started``, when a migration started it on ``destination`` from
    checkpoint ``sequence``."""
    from portal.core.models import Checkpoint, Migration, MigrationMode, Placement

    Placement.objects.filter(job=job, node=source).update(ended_at=started, end_reason="migrated")
    run = Placement.objects.create(job=job, node=destination, gpu_indices=[0])
    Placement.objects.filter(pk=run.pk).update(started_at=started)
    mig = Migration.objects.create(job=job, source=source, destination=destination, mode=MigrationMode.values[0],
                                   checkpoint=Checkpoint.objects.get(job=job, sequence=sequence),
                                   finished_at=started, success=True)
    Migration.objects.filter(pk=mig.pk).update(started_at=started - dt.timedelta(seconds=1))


@db
def test_a_cut_off_run_that_wrote_no_checkpoint_heard_counts_its_own_slow_steps_not_the_jobs_typical_step() -> None:
    """tests/chaos agent_cut: a run resumed from step 200 (a checkpoint an earlier run wrote, at 0.1 s a step)
    and was cut off 2 s later; the checkpoint it then wrote took 15 s (a loaded disk) and never reached the
    portal. Given up, the job resumed from step 200 again. The late job_exited says step 300 at 26 s into the
    run, and that the run was paused (fenced) only after that: the 100 redone steps took 26 s, not the 10 s the
    job's typical step gives (which the portal recorded: 2.7 s for 9.4 s redone)."""
    from django.utils import timezone

    from portal.core.models import Checkpoint, Migration

    first, src, holder = _online("first"), _online("src"), _online("holder")
    job = make_running_job(first)
    _run(job, first, 120.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    Checkpoint.objects.filter(job=job).update(node=None)  # the copies left are the holder's
    started = timezone.now() - dt.timedelta(seconds=60)
    _moved_to(job, first, src, started, sequence=2)
    mig = _cut_off(src, holder, job, 2, 200, heard_step=220)
    assert mig.work_lost_s == pytest.approx((220 - 200) * STEP_S, rel=0.01)  # all the portal knew then
    _handle(src, "job_exited", job_id=job.pk, returncode=-9, step=300, result={}, reason="given away",
            step_at=_at(started, 26.0), paused=[[_at(started, 26.1), _at(started, 50.0)]])
    assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx(26.0, rel=0.01)


@db
def test_a_cut_off_run_that_resumed_from_an_older_checkpoint_than_the_newest_counts_from_the_step_it_restored(
        ) -> None:
    """The review's case: checkpoints at steps 100 and 200 exist, but the run on ``src`` was started from step 100
    (the newer one never left its node). It ran 100 → 300 in 26 s and was cut off; the job resumed from step 100
    again. The 200 redone steps took the run's 26 s: the run's start counts at the step it restored (100), not
    at the newest checkpoint before it (200, which would price each step twice as dear: 52 s)."""
    from django.utils import timezone

    from portal.core.models import Checkpoint, Migration

    first, src, holder = _online("first"), _online("src"), _online("holder")
    job = make_running_job(first)
    _run(job, first, 120.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    Checkpoint.objects.filter(job=job).update(node=None)
    Checkpoint.objects.get(job=job, sequence=2).replica_nodes.clear()  # only step 100 can be restored
    started = timezone.now() - dt.timedelta(seconds=60)
    _moved_to(job, first, src, started, sequence=1)
    mig = _cut_off(src, holder, job, 1, 100, heard_step=120)
    assert mig.checkpoint is not None and mig.checkpoint.step == 100
    _handle(src, "job_exited", job_id=job.pk, returncode=-9, step=300, result={}, reason="given away",
            step_at=_at(started, 26.0), paused=[[_at(started, 26.1), _at(started, 50.0)]])
    assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx(26.0, rel=0.01)


@db
def test_a_run_whose_agent_reports_no_pause_counts_a_slow_stretch_at_its_pace_and_a_reported_pause_not_at_all(
        ) -> None:
    """The stretch from the checkpoint resumed from (step 200, at 20 s) to the final step (300, at 45 s) is 2.5
    times the run's typical 0.1 s a step. Without a pause list the portal cannot tell a slow stretch from a
    pause and takes the typical step; with one it knows: no pause, so 25 s; or a 15 s pause, so 10 s."""
    from portal.core.models import Migration

    for name, paused, expected_s in (("none", None, 10.0), ("slow", [], 25.0),
                                     ("fenced", [[22.0, 37.0]], 10.0)):
        src, holder = _online(f"src-{name}"), _online(f"holder-{name}")
        job = make_running_job(src)
        started = _run(job, src, 90.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
        mig = _cut_off(src, holder, job, 2, 200, heard_step=210)
        extra = {} if paused is None else {"paused": [[_at(started, a), _at(started, b)] for a, b in paused]}
        _handle(src, "job_exited", job_id=job.pk, returncode=-9, step=300, result={}, reason="given away",
                step_at=_at(started, 45.0), **extra)
        assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx(expected_s, rel=0.01), name


def test_the_pause_list_of_a_job_exited_is_checked_at_the_boundary() -> None:
    from portal.control.link.protocol import MAX_PAUSES, ProtocolError, validate

    base = {"type": "job_exited", "job_id": 3, "returncode": -9, "step": 10, "result": {}, "reason": "r"}
    t = 1.8e9
    assert validate({**base, "paused": []}) == "job_exited"
    assert validate({**base, "paused": [[t, t + 5], [t + 5, t + 9.5]]}) == "job_exited"
    for bad in ("x", [[t]], [[t, "t"]], [[t, float("nan")]], [[t, float("inf")]], [[True, t]], [[t, t - 1]],
                [[t, t + 5], [t + 4, t + 6]], [[-1.0, t]], [[t, 2.0**40]], [{"start": t, "end": t}],
                [[t + i, t + i] for i in range(MAX_PAUSES + 1)]):
        with pytest.raises(ProtocolError):
            validate({**base, "paused": bad})
