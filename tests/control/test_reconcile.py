"""The reconciler redoes steps whose task was lost (design §9.6), and leaves alone steps that are only under way."""

from __future__ import annotations

import datetime as dt

import pytest
from control_helpers import make_node, make_running_job
from django.utils import timezone

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _ago(seconds: float) -> dt.datetime:
    return timezone.now() - dt.timedelta(seconds=seconds)


def _lent(name: str, port: int) -> object:
    from portal.control.models import AgentSession
    from portal.core.lifecycle import nodes as node_lifecycle

    node, _ = make_node(name)
    node_lifecycle.come_online(node)
    AgentSession.objects.create(node=node, channel_name=f"test-{name}", data_host="127.0.0.1", data_port=port)
    return node


def test_a_reclaim_whose_task_never_ran_is_planned_and_a_fresh_one_is_left_alone() -> None:
    from portal.control.loop.reconcile import reconcile
    from portal.control.models import ReclaimWork
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import ReclaimEvent

    lost, fresh = _lent("lost-task", 9101), _lent("fresh-task", 9102)
    reclaims = {}
    for node, age_s in ((lost, 60), (fresh, 1)):
        node_lifecycle.reclaim(node)  # what request_reclaim did before its task was lost
        reclaims[node.pk] = ReclaimEvent.objects.create(node=node, kind="emergency", notice_s=0,
                                                        deadline_at=timezone.now())
        ReclaimEvent.objects.filter(pk=reclaims[node.pk].pk).update(requested_at=_ago(age_s))
    assert reconcile() == {"reclaims": 1, "migrations": 0, "commands": 0}
    work = ReclaimWork.objects.get(reclaim=reclaims[lost.pk])
    assert work.phase == "recovered"
    assert ReclaimEvent.objects.get(pk=reclaims[lost.pk].pk).finished_at is not None
    assert not ReclaimWork.objects.filter(reclaim=reclaims[fresh.pk]).exists()
    assert reconcile() == {"reclaims": 0, "migrations": 0, "commands": 0}  # done: nothing to redo


def test_a_received_transfer_whose_advance_was_lost_starts_the_job_on_its_destination() -> None:
    from portal.control.loop.reconcile import reconcile
    from portal.control.models import (
        MigrationPhase,
        MigrationWork,
        Transfer,
        TransferPurpose,
        TransferState,
        hash_transfer_token,
        new_transfer_token,
    )
    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import Checkpoint, Migration, MigrationMode, Placement

    src, dst = _lent("mig-src", 9111), _lent("mig-dst", 9112)
    moving = []
    for transfer_state in (TransferState.RECEIVED, TransferState.ISSUED):
        job = make_running_job(src)
        job_lifecycle.begin_migration(job)
        Placement.objects.filter(job=job).update(ended_at=_ago(40), end_reason="migrated")
        ckpt = Checkpoint.objects.create(job=job, node=src, sequence=1, size_bytes=10, sha256="0" * 64,
                                         taken_at=_ago(50), completed_at=_ago(50))
        mig = Migration.objects.create(job=job, source=src, destination=dst, mode=MigrationMode.PLANNED,
                                       checkpoint=ckpt)
        MigrationWork.objects.create(migration=mig, phase=MigrationPhase.TRANSFERRING, requested_at=_ago(60),
                                     phase_entered_at=_ago(40), restore_sequence=1)
        Transfer.objects.create(job=job, checkpoint=ckpt, migration=mig, source=src, destination=dst,
                                purpose=TransferPurpose.MIGRATION, state=transfer_state,
                                token_hash=hash_transfer_token(new_transfer_token()),
                                expires_at=timezone.now() + dt.timedelta(minutes=5),
                                finished_at=_ago(30) if transfer_state == TransferState.RECEIVED else None)
        moving.append((job, mig))
    assert reconcile() == {"reclaims": 0, "migrations": 1, "commands": 0}
    (received_job, received), (issued_job, issued) = moving
    assert MigrationWork.objects.get(migration=received).phase == MigrationPhase.STARTING
    assert Placement.objects.get(job=received_job, ended_at__isnull=True).node_id == dst.pk
    # Still copying: not the reconciler's business.
    assert MigrationWork.objects.get(migration=issued).phase == MigrationPhase.TRANSFERRING
    assert not Placement.objects.filter(job=issued_job, ended_at__isnull=True).exists()
    assert reconcile()["migrations"] == 0
