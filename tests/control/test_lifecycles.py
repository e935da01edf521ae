"""The reclaim, migration and transfer lifecycles: every move the table allows succeeds and records its bookkeeping;
every other one raises and changes nothing; a row another worker moved first is never moved twice."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from control_helpers import make_node, make_running_job
from django.utils import timezone

from portal.control.models import (
    MigrationPhase,
    MigrationWork,
    ReclaimPhase,
    ReclaimWork,
    Transfer,
    TransferPurpose,
    TransferState,
    hash_transfer_token,
    new_transfer_token,
)
from portal.control.reclaim import lifecycle
from portal.core.lifecycle import ConcurrentTransition, InvalidTransition
from portal.core.lifecycle.base import claim_transition
from portal.core.models import Checkpoint, Migration, MigrationMode

pytestmark = pytest.mark.django_db

PHASES = [p.value for p in MigrationPhase]


def _work(phase: str) -> MigrationWork:
    node, _ = make_node(f"lc-{MigrationWork.objects.count()}")
    job = make_running_job(node)
    mig = Migration.objects.create(job=job, source=node, mode=MigrationMode.PLANNED)
    return MigrationWork.objects.create(migration=mig, phase=phase, requested_at=timezone.now())


@pytest.mark.parametrize(("current", "target"), list(itertools.product(PHASES, PHASES)))
def test_every_migration_move_is_allowed_exactly_when_the_table_says(current: str, target: str) -> None:
    work = _work(current)
    before = MigrationWork.objects.filter(pk=work.pk).values().get()
    if target in lifecycle.MIGRATION_TRANSITIONS[current]:
        lifecycle.move(work, target, detail="moved by the test")
        row = MigrationWork.objects.get(pk=work.pk)
        assert (row.phase, row.detail) == (target, "moved by the test")
        assert row.phase_entered_at is not None
        assert row.phase_attempts == (1 if target == current else 0)
        timeout = lifecycle.PHASE_TIMEOUT_S[target]
        if timeout is None:
            assert row.phase_deadline_at is None
        else:
            expected = row.phase_entered_at + dt.timedelta(seconds=timeout)
            assert abs((row.phase_deadline_at - expected).total_seconds()) < 1e-3
    else:
        with pytest.raises(InvalidTransition):
            lifecycle.move(work, target, detail="must not be written")
        assert MigrationWork.objects.filter(pk=work.pk).values().get() == before


def test_finished_migrations_never_move_again() -> None:
    for phase in (MigrationPhase.DONE, MigrationPhase.FAILED):
        assert lifecycle.MIGRATION_TRANSITIONS[phase] == frozenset()
    assert set(lifecycle.MIGRATION_TRANSITIONS) == set(PHASES)


def test_a_migration_another_worker_moved_first_is_not_moved_again() -> None:
    work = _work(MigrationPhase.TRANSFERRING)
    stale = MigrationWork.objects.get(pk=work.pk)
    lifecycle.move(work, MigrationPhase.STARTING)
    with pytest.raises(ConcurrentTransition):
        lifecycle.move(stale, MigrationPhase.WAITING, detail="late")
    row = MigrationWork.objects.get(pk=work.pk)
    assert row.phase == MigrationPhase.STARTING and row.detail != "late"


def _transfer(state: str) -> Transfer:
    node, _ = make_node(f"tr-{Transfer.objects.count()}")
    other, _ = make_node(f"tr-other-{Transfer.objects.count()}")
    job = make_running_job(node)
    now = timezone.now()
    ckpt = Checkpoint.objects.create(job=job, node=node, sequence=1, size_bytes=10, sha256="0" * 64, taken_at=now,
                                     completed_at=now)
    return Transfer.objects.create(job=job, checkpoint=ckpt, source=node, destination=other,
                                   purpose=TransferPurpose.PRESYNC, state=state,
                                   token_hash=hash_transfer_token(new_transfer_token()),
                                   expires_at=now + dt.timedelta(minutes=5))


@pytest.mark.parametrize("target", [TransferState.RECEIVED, TransferState.FAILED])
def test_an_issued_transfer_finishes_once_and_the_first_report_wins(target: str) -> None:
    transfer = _transfer(TransferState.ISSUED)
    assert lifecycle.finish_transfer(transfer.pk, target) is True
    other = TransferState.FAILED if target == TransferState.RECEIVED else TransferState.RECEIVED
    assert lifecycle.finish_transfer(transfer.pk, other) is False
    row = Transfer.objects.get(pk=transfer.pk)
    assert row.state == target and row.finished_at is not None


@pytest.mark.parametrize(("current", "target"), [
    (s, t) for s, t in itertools.product([s.value for s in TransferState], repeat=2)
    if t not in lifecycle.TRANSFER_TRANSITIONS[s]])
def test_a_transfer_move_outside_the_table_raises_and_changes_nothing(current: str, target: str) -> None:
    transfer = _transfer(current)
    before: dict[str, Any] = Transfer.objects.filter(pk=transfer.pk).values().get()
    with pytest.raises(InvalidTransition):
        claim_transition("transfer", lifecycle.TRANSFER_TRANSITIONS, Transfer, transfer.pk, current, target)
    assert Transfer.objects.filter(pk=transfer.pk).values().get() == before


def test_only_the_lifecycle_module_moves_phases_and_transfer_states() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "portal"
    offenders = []
    pattern = re.compile(r"\.phase\s*=[^=]|update\([^)]*\b(phase|state)=(MigrationPhase|TransferState|ReclaimPhase)\.")
    for path in root.rglob("*.py"):
        if path.name == "lifecycle.py" or "migrations" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert offenders == []


RECLAIM_PHASES = [p.value for p in ReclaimPhase]


def _reclaim_work(phase: str) -> ReclaimWork:
    from portal.core.models import ReclaimEvent

    node, _ = make_node(f"rc-{ReclaimWork.objects.count()}")
    reclaim = ReclaimEvent.objects.create(node=node, kind="scheduled", notice_s=60,
                                          deadline_at=timezone.now() + dt.timedelta(seconds=60))
    work = lifecycle.reclaim_work(reclaim.pk)
    ReclaimWork.objects.filter(pk=work.pk).update(phase=phase)
    return ReclaimWork.objects.get(pk=work.pk)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(RECLAIM_PHASES, RECLAIM_PHASES)))
def test_every_reclaim_move_is_allowed_exactly_when_the_table_says(current: str, target: str) -> None:
    work = _reclaim_work(current)
    before = ReclaimWork.objects.filter(pk=work.pk).values().get()
    deadline = timezone.now() + dt.timedelta(seconds=60)
    if target in lifecycle.RECLAIM_TRANSITIONS[current]:
        assert lifecycle.claim_reclaim(work.reclaim_id, current, target, deadline_at=deadline) is True
        row = ReclaimWork.objects.get(pk=work.pk)
        assert row.phase == target and row.phase_deadline_at == deadline and row.phase_entered_at is not None
        assert getattr(row, lifecycle.RECLAIM_STAMP[target]) is not None
        assert lifecycle.claim_reclaim(work.reclaim_id, current, target) is False  # the step was taken
    else:
        with pytest.raises(InvalidTransition):
            lifecycle.claim_reclaim(work.reclaim_id, current, target)
        assert ReclaimWork.objects.filter(pk=work.pk).values().get() == before


def test_a_new_reclaim_must_be_planned_within_its_planning_deadline() -> None:
    work = _reclaim_work(ReclaimPhase.REQUESTED)
    fresh = lifecycle.reclaim_work(work.reclaim_id)
    assert fresh.phase == ReclaimPhase.REQUESTED
    ReclaimWork.objects.filter(pk=work.pk).delete()
    created = lifecycle.reclaim_work(work.reclaim_id)
    window = (created.phase_deadline_at - created.phase_entered_at).total_seconds()
    assert window == pytest.approx(lifecycle.PLAN_TIMEOUT_S)
    assert set(lifecycle.RECLAIM_TRANSITIONS) == set(RECLAIM_PHASES)
    for terminal in (ReclaimPhase.RECOVERED, ReclaimPhase.RELEASED, ReclaimPhase.FORCED):
        assert lifecycle.RECLAIM_TRANSITIONS[terminal] == frozenset()
