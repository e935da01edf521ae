"""The campus data model (design §1), split by resource."""

from portal.core.models.accounts import Provider, ResearchGroup
from portal.core.models.campus import Building, Link, Switch
from portal.core.models.jobs import Checkpoint, Job, Placement, PriorityClass
from portal.core.models.logs import AuditLog, DecisionLog
from portal.core.models.nodes import Gpu, LendingWindow, Node
from portal.core.models.outbox import IdempotencyKey, OutboxMessage
from portal.core.models.output import JobOutput, JobOutputChunk
from portal.core.models.reclaims import Migration, MigrationMode, ReclaimEvent, ReclaimKind, ReclaimOutcome
from portal.core.models.reserve import LinkClassSample, LinkReserve, LinkScope, ReserveSource
from portal.core.models.results import GroupResultsCap, JobResultFile, JobResults, ResultKind, ResultsState
from portal.core.models.telemetry import (
    BandwidthSample,
    HazardEstimate,
    HazardScope,
    LinkEstimate,
    NodeAvailability,
)

__all__ = [
    "AuditLog",
    "BandwidthSample",
    "Building",
    "Checkpoint",
    "DecisionLog",
    "Gpu",
    "GroupResultsCap",
    "HazardEstimate",
    "HazardScope",
    "IdempotencyKey",
    "Job",
    "JobOutput",
    "JobOutputChunk",
    "JobResultFile",
    "JobResults",
    "LendingWindow",
    "Link",
    "LinkClassSample",
    "LinkEstimate",
    "LinkReserve",
    "LinkScope",
    "Migration",
    "MigrationMode",
    "Node",
    "NodeAvailability",
    "OutboxMessage",
    "Placement",
    "PriorityClass",
    "Provider",
    "ReclaimEvent",
    "ReclaimKind",
    "ReclaimOutcome",
    "ResearchGroup",
    "ReserveSource",
    "ResultKind",
    "ResultsState",
    "Switch",
]
