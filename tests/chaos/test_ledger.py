"""The chaos suite's measure of work redone (tests/chaos/ledger.py), on hand-written ledgers."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.ledger import Ledger, MigrationRecord, Run, overlaps, reconcile, redos

STEP_S = 0.1


def _run(run: str, node: str, start_t: float, first: int, last: int) -> Run:
    """A run executing steps first..last, one every STEP_S from start_t."""
    return Run(7, run, node, start_t, [(s, start_t + (i + 1) * STEP_S) for i, s in enumerate(range(first, last + 1))])


def test_a_resume_from_the_last_step_redoes_nothing() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "b", 20.0, 100, 150)]
    (redo,) = redos(runs)
    assert (redo.resumed_step, redo.frontier, redo.redone_steps, redo.redone_s) == (100, 100, 0, 0.0)


def test_a_resume_from_an_older_checkpoint_redoes_the_steps_since_it() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "b", 20.0, 60, 150)]
    (redo,) = redos(runs)
    assert redo.redone_steps == 40
    assert abs(redo.redone_s - 40 * STEP_S) < 1e-6


def test_a_matching_record_is_not_a_mismatch() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "b", 20.0, 60, 150)]
    mig = MigrationRecord(1, 7, 15.0, checkpoint_step=60, work_lost_s=4.0, done=True)
    assert reconcile([mig], redos(runs), STEP_S) == []


def test_under_recorded_loss_and_a_wrong_resume_step_are_mismatches() -> None:
    runs = [_run("r1", "a", 0.0, 0, 299), _run("r2", "b", 40.0, 60, 350)]  # 240 steps = 24 s redone
    mig = MigrationRecord(1, 7, 35.0, checkpoint_step=200, work_lost_s=3.5, done=True)
    kinds = {m.kind for m in reconcile([mig], redos(runs), STEP_S)}
    assert kinds == {"resume", "lost"}


def test_a_restart_loop_adds_up_under_its_migration() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "b", 20.0, 100, 119), _run("r3", "b", 30.0, 0, 50)]
    mig = MigrationRecord(1, 7, 15.0, checkpoint_step=100, work_lost_s=0.0, done=True)
    (mismatch,) = reconcile([mig], redos(runs), STEP_S)
    assert mismatch.kind == "lost" and "120 steps" in mismatch.what


def test_a_restart_no_migration_records_is_a_mismatch() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "a", 20.0, 50, 120)]
    (mismatch,) = reconcile([], redos(runs), STEP_S)
    assert mismatch.kind == "unrecorded:r2" and mismatch.migration is None


def test_a_migration_recorded_as_resumed_with_no_run_after_it_is_a_mismatch() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99)]
    mig = MigrationRecord(1, 7, 15.0, checkpoint_step=100, work_lost_s=0.0, done=True)
    assert [m.kind for m in reconcile([mig], redos(runs), STEP_S)] == ["no-run"]


def test_two_runs_stepping_at_once_are_a_job_running_twice() -> None:
    a, b = _run("r1", "a", 0.0, 0, 99), _run("r2", "b", 5.0, 40, 90)  # a steps until 10.0, b from 5.1
    ((first, second, common_s),) = overlaps([a, b])
    assert (first.run, second.run) == ("r1", "r2") and abs(common_s - 4.9) < 1e-6
    assert overlaps([a, _run("r2", "b", 10.5, 100, 120)]) == []


def test_a_cut_short_restart_and_the_one_after_it_are_not_counted_twice() -> None:
    runs = [_run("r1", "a", 0.0, 0, 612), _run("r2", "b", 70.0, 427, 428), _run("r3", "c", 75.0, 38, 700)]
    assert [(r.resumed_step, r.frontier, r.redone_steps) for r in redos(runs)] == [(427, 613, 186), (38, 429, 391)]


def test_a_run_is_attributed_to_the_migration_that_sent_the_job_to_its_node() -> None:
    runs = [_run("r1", "a", 0.0, 0, 99), _run("r2", "b", 20.0, 100, 150), _run("r3", "c", 30.0, 80, 200)]
    to_b = MigrationRecord(1, 7, 15.0, checkpoint_step=100, work_lost_s=0.0, done=True, destination="b")
    to_c = MigrationRecord(2, 7, 16.0, checkpoint_step=80, work_lost_s=7.1, done=True, destination="c")
    assert reconcile([to_b, to_c], redos(runs), STEP_S) == []


def test_the_ledger_file_is_read_incrementally_and_ignores_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    lines = [{"job": "7", "run": "r1", "node": "a", "event": "start", "t": 1.0},
             {"job": "7", "run": "r1", "node": "a", "step": 0, "t": 1.1}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"job": "7", "ru')
    ledger = Ledger(path)
    ledger.refresh()
    assert [r.steps for r in ledger.runs()[7]] == [[(0, 1.1)]]
    with open(path, "a") as fh:
        fh.write('n": "r1", "node": "a", "step": 1, "t": 1.2}\n')
    ledger.refresh()
    assert [r.steps for r in ledger.runs()[7]] == [[(0, 1.1), (1, 1.2)]]


def test_time_a_run_spent_paused_is_not_counted_as_work_redone() -> None:
    run = _run("r1", "a", 0.0, 0, 99)  # steps every 0.1 s until 10.0 ...
    run.steps = run.steps[:50] + [(s, t + 10.0) for s, t in run.steps[50:]]  # ... paused 10 s after step 49
    run.continued = [14.0]
    (redo,) = redos([run, _run("r2", "b", 30.0, 40, 150)])
    assert redo.redone_steps == 60
    assert abs(redo.redone_s - 60 * STEP_S) < 1e-6
    run.continued = []  # a stall nobody paused (the machine busy) is wall time the run spent: it counts
    (redo,) = redos([run, _run("r2", "b", 30.0, 40, 150)])
    assert abs(redo.redone_s - (60 * STEP_S + 10.0)) < 1e-6
