"""The job and node states and the transitions between them (design §1), with no model in sight.

The models take their ``state`` choices from here and the lifecycle modules (``portal.core.lifecycle``) take the
models and these tables, so the import arrow runs one way: states ← models ← lifecycle. Only the lifecycle moves
a state; this module only names them.
"""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    MIGRATING = "migrating", "migrating"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    SUSPENDED = "suspended", "suspended"  # released by the idle watchdog or the loan timer; its owner resumes it


JOB_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

# Where a job may go from each state (the diagram in portal.core.lifecycle.jobs).
JOB_ALLOWED: dict[str, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.MIGRATING, JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.MIGRATING: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED, JobState.SUSPENDED}
    ),
    # Released by the idle watchdog or the loan timer (design §15): off its node, resumable by its owner.
    JobState.SUSPENDED: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class NodeState(models.TextChoices):
    REGISTERED = "registered", "registered"
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"
    DRAINING = "draining", "draining"
    RECLAIMED = "reclaimed", "reclaimed"
    RETIRED = "retired", "retired"


# Where a node may go from each state (the diagram in portal.core.lifecycle.nodes).
NODE_ALLOWED: dict[str, frozenset[str]] = {
    NodeState.REGISTERED: frozenset({NodeState.ONLINE, NodeState.RETIRED, NodeState.RECLAIMED}),
    NodeState.ONLINE: frozenset({NodeState.OFFLINE, NodeState.DRAINING, NodeState.RECLAIMED, NodeState.RETIRED}),
    NodeState.OFFLINE: frozenset({NodeState.ONLINE, NodeState.RECLAIMED, NodeState.RETIRED}),
    NodeState.DRAINING: frozenset({NodeState.RECLAIMED, NodeState.RETIRED}),
    NodeState.RECLAIMED: frozenset({NodeState.OFFLINE, NodeState.RETIRED}),
    NodeState.RETIRED: frozenset(),
}

NODE_LENDABLE = frozenset({NodeState.ONLINE})
