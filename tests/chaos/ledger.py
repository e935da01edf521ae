"""Work actually redone, from the step ledger of tests/chaos/steplog.py, against what the portal recorded.

The measure (per job; steps are the 0-based indices handed to ``train_step``):

- A *run* is one trainer process (one ``run`` id). Runs are ordered by their start line.
- Run k (k ≥ 1) *resumed at* R_k, the first step it executed (a checkpoint taken after step S restores to
  S, so R_k equals the step of the checkpoint it restored; 0 for a fresh start).
- Its *frontier* F_k is 1 + the last step the previous run (k − 1) had executed when run k started: the
  progress of the timeline run k replaces.
- Run k *redoes* max(0, F_k − R_k) steps: progress thrown away, to be executed again. ``redone_s`` is the wall
  time earlier runs spent on those steps (per step: the time since the previous step of the same run, for the
  latest earlier execution of it). Summed over a job's runs this is its total work lost, each step counted
  once per time it was thrown away. Time a run spent paused is not work (design §9.9: time the job did not
  run is not work lost): a run its agent fenced (SIGSTOP until the portal hears it again, §9.10) logs a
  ``continued`` line when resumed, and the step whose interval holds one counts at the run's median step.
- Run k is attributed to the job's latest migration that started before it with run k's node as destination,
  else to its latest migration that started before it (a restart loop puts several runs on one migration).
  A migration's *actual* loss is the sum over its runs, its *actual* resume step that of its first run.

A migration is *misrecorded* when its recorded checkpoint step (0 when none) is not the step actually resumed,
or when its ``work_lost_s`` differs from the actual ``redone_s`` by more than max(1 s, 20 %, 3 step times)
(the margin covers what the portal cannot know exactly: the steps after a job's last progress record, at most
its 0.2 s progress period, when a killed agent's successor reports how far it got (design §9.9), or a heartbeat
interval when nothing is reported; and step times that vary with the load on 2 shared cores, which the
portal measures from the run's checkpoints while this ledger sums the steps themselves). A run that threw work away with no migration started before it counts as
misrecorded too (work lost that no row shows).

Separately, two runs of one job executing steps at the same time for more than ``OVERLAP_GRACE_S`` is the
job *running twice* (``overlaps``): the later copy's or the earlier copy's work is wasted either way.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OVERLAP_GRACE_S = 1.0


@dataclass
class Run:
    job: int
    run: str
    node: str
    start_t: float
    steps: list[tuple[int, float]] = field(default_factory=list)  # (step, t) in execution order
    exit_code: int | None = None
    continued: list[float] = field(default_factory=list)  # when it was resumed after a pause (SIGCONT)

    @property
    def last_t(self) -> float:
        return self.steps[-1][1] if self.steps else self.start_t

    def durations(self) -> dict[int, float]:
        """Wall time of each executed step (the first one, and one whose interval holds a pause, get the run's
        median)."""
        out: dict[int, float] = {}
        gaps = [b[1] - a[1] for a, b in zip(self.steps, self.steps[1:], strict=False)]
        median = statistics.median(gaps) if gaps else 0.0
        for i, (step, t) in enumerate(self.steps):
            paused = i and any(self.steps[i - 1][1] < c <= t for c in self.continued)
            out[step] = (t - self.steps[i - 1][1]) if i and not paused else median
        return out


@dataclass(frozen=True)
class Redo:
    job: int
    run: str
    node: str
    start_t: float
    resumed_step: int
    frontier: int
    redone_steps: int
    redone_s: float


@dataclass(frozen=True)
class MigrationRecord:
    pk: int
    job: int
    started_t: float
    checkpoint_step: int | None  # None: restarted from the beginning (or not yet chosen)
    work_lost_s: float
    done: bool  # its work reached "done": the job was started on the destination
    destination: str = ""  # the destination node's name ("" when none)


@dataclass(frozen=True)
class Mismatch:
    job: int
    migration: int | None
    kind: str
    what: str

    @property
    def key(self) -> tuple[int, int | None, str]:
        return (self.job, self.migration, self.kind)


class Ledger:
    """Reads the ledger file incrementally; ``runs()`` gives every job's runs in start order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._runs: dict[str, Run] = {}

    def refresh(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self.offset += end
        for raw in data[:end].splitlines():
            self.add(json.loads(raw))

    def add(self, line: dict[str, Any]) -> None:
        run = self._runs.get(line["run"])
        if run is None:
            run = self._runs[line["run"]] = Run(int(line["job"] or 0), line["run"], line.get("node", ""),
                                                float(line["t"]))
        if "step" in line:
            run.steps.append((int(line["step"]), float(line["t"])))
        elif line.get("event") == "exit":
            run.exit_code = int(line.get("code", 0))
        elif line.get("event") == "continued":
            run.continued.append(float(line["t"]))

    def runs(self) -> dict[int, list[Run]]:
        out: dict[int, list[Run]] = defaultdict(list)
        for run in self._runs.values():
            out[run.job].append(run)
        for runs in out.values():
            runs.sort(key=lambda r: r.start_t)
        return dict(out)


def redos(runs: list[Run]) -> list[Redo]:
    """Every run after the first that executed a step, with what it redid (see the module docstring)."""
    out: list[Redo] = []
    latest: dict[int, float] = {}  # step -> duration of its latest execution by a run started earlier
    previous: Run | None = None
    for run in runs:
        if not run.steps:
            continue
        resumed = run.steps[0][0]
        if previous is not None:
            done_before = [s for s, t in previous.steps if t <= run.start_t] or [previous.steps[0][0] - 1]
            frontier = max(done_before) + 1
            redone = range(resumed, frontier)
            out.append(Redo(run.job, run.run, run.node, run.start_t, resumed, frontier, len(redone),
                            sum(latest.get(s, 0.0) for s in redone)))
        latest.update(run.durations())
        previous = run
    return out


def median_step_s(runs: list[Run]) -> float:
    gaps = [d for r in runs for d in r.durations().values()]
    return statistics.median(gaps) if gaps else 0.0


def attribute(migrations: list[MigrationRecord], job_redos: list[Redo]) -> dict[int | None, list[Redo]]:
    """One job's redos by the migration each is attributed to (None: no migration started before it)."""
    migs = sorted(migrations, key=lambda m: m.started_t)
    by_mig: dict[int | None, list[Redo]] = defaultdict(list)
    for redo in job_redos:
        before = [m for m in migs if m.started_t <= redo.start_t]
        to_here = [m for m in before if m.destination == redo.node]
        chosen = to_here or before
        by_mig[chosen[-1].pk if chosen else None].append(redo)
    return by_mig


def reconcile(migrations: list[MigrationRecord], job_redos: list[Redo], step_s: float) -> list[Mismatch]:
    """Compare one job's migrations with its redos (see the module docstring). ``Mismatch.kind`` names the rule
    (resume, lost, no-run, unrecorded), so a caller can tell a new mismatch from one it has seen."""
    migs = sorted(migrations, key=lambda m: m.started_t)
    by_mig = attribute(migs, job_redos)
    out: list[Mismatch] = []
    for mig in migs:
        mine = by_mig.get(mig.pk, [])
        if not mine:
            if mig.done:
                out.append(Mismatch(mig.job, mig.pk, "no-run", "recorded as resumed, but no run started after it"))
            continue
        resumed = mine[0].resumed_step
        recorded_step = mig.checkpoint_step or 0
        if recorded_step != resumed:
            out.append(Mismatch(mig.job, mig.pk, "resume", f"recorded resume from step {recorded_step}, "
                                                           f"actually resumed at step {resumed}"))
        actual_s = sum(r.redone_s for r in mine)
        steps = sum(r.redone_steps for r in mine)
        margin_s = max(1.0, 0.2 * actual_s, 3 * step_s)
        if abs(mig.work_lost_s - actual_s) > margin_s:
            out.append(Mismatch(mig.job, mig.pk, "lost", f"work_lost_s {mig.work_lost_s:.1f} recorded, "
                                                         f"{actual_s:.1f} s ({steps} steps, {len(mine)} run(s) "
                                                         f"on {', '.join(r.node for r in mine)}) actually redone"))
    for redo in by_mig.get(None, []):
        if redo.redone_steps > 0:
            out.append(Mismatch(redo.job, None, f"unrecorded:{redo.run}",
                                f"run on {redo.node} redid {redo.redone_steps} steps ({redo.redone_s:.1f} s) "
                                "with no migration recorded"))
    return out


def overlaps(runs: list[Run], grace_s: float = OVERLAP_GRACE_S) -> list[tuple[Run, Run, float]]:
    """Pairs of one job's runs that executed steps during a common interval longer than ``grace_s``."""
    out = []
    stepping = [r for r in runs if r.steps]
    for i, a in enumerate(stepping):
        for b in stepping[i + 1:]:
            common_s = min(a.last_t, b.last_t) - max(a.steps[0][1], b.steps[0][1])
            if common_s > grace_s:
                out.append((a, b, common_s))
    return out
