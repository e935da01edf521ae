"""The agent websocket protocol (portal side): TypedDict payloads and their validation (design §1-§4, §9.9).

Every message is a JSON object with a ``type``. Reliable reports (:data:`RELIABLE`) carry a ``msg_id`` (optional
in validation, for older agents; the agent always sends it): the portal answers ``{"type": "received",
"msg_id"}`` once the report's transaction committed or it was refused for good, and the agent sends it again
until then. Commands carry a ``cmd_id`` the agent acknowledges with ``ack``. :func:`validate` checks an agent message's shape (types of
required fields, bounded sizes) before any handler runs; a :class:`ProtocolError` names what was wrong and the
consumer rejects the message without changing anything.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, NotRequired, TypedDict

from portal.control.link.class_bytes import ClassBytesError, check_class_bytes
from portal.control.link.gpu_state import GpuStateError, check_gpu_state

MAX_MESSAGE_BYTES = 64 * 1024
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ProtocolError(ValueError):
    """A message was refused; ``reason`` says why."""


# --- agent → portal -----------------------------------------------------------------------------------------
RELIABLE = frozenset({"checkpoint_done", "job_started", "job_exited", "transfer_received", "transfer_sent",
                      "transfer_rejected", "killswitch_engaged", "checkpoints_dropped", "job_output"})
MSG_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_HELD_CHECKPOINTS = 512  # checkpoints a hello lists; an agent holding more says ``checkpoints_truncated``
RESTORE_FAILED = "restore checkpoint missing or corrupt"  # job_exited.reason of a start that could not restore
MAX_OUTPUT_TEXT_CHARS = 16 * 1024  # job_output.text; the agent ships at most 16 KiB of UTF-8 a report (§9.11)
MAX_OUTPUT_TAIL_CHARS = 4096  # job_exited.output_tail read by the portal (a longer one is cut, never refused)


class HeldCheckpoint(TypedDict):
    job_id: int
    sequence: int
    sha256: str


class JobStep(TypedDict):
    job_id: int
    step: int
    gpu_util: NotRequired[float]  # heartbeats: mean utilisation of the job's GPUs, percent (design §15)


class Hello(TypedDict):
    type: Literal["hello"]
    token: NotRequired[str]
    agent_version: str
    gpus: list[dict[str, Any]]
    data_host: str
    data_port: int
    jobs: list[JobStep]
    edge_backend: NotRequired[str]
    confinement: NotRequired[str]  # how jobs run: "confined: …" or "unconfined: …" (design §19.6), ≤ 400 chars
    checkpoints: NotRequired[list[HeldCheckpoint]]  # what it holds now (its own and replicas), sequence + sha256
    checkpoints_truncated: NotRequired[bool]  # more than MAX_HELD_CHECKPOINTS: the list is not the whole truth
    ended_jobs: NotRequired[list[dict[str, Any]]]  # a restarted agent: {job_id, step, t} its predecessor's jobs got to
    gpu_state: NotRequired[list[dict[str, Any]]]  # MIG + foreign processes per GPU (link/gpu_state.py, design §1)


class Heartbeat(TypedDict):
    type: Literal["heartbeat"]
    seq: int
    gpu_util: list[float]
    egress: dict[str, Any]
    jobs: list[JobStep]
    gpu_state: NotRequired[list[dict[str, Any]]]  # MIG + foreign processes per GPU (link/gpu_state.py, design §1)
    class_bytes: NotRequired[dict[str, Any]]  # bytes per traffic class per link (link/class_bytes.py, design §4)


class CheckpointDone(TypedDict):
    type: Literal["checkpoint_done"]
    job_id: int
    sequence: int
    step: int
    size_bytes: int
    sha256: str
    taken_at: float
    final: bool
    compat: dict[str, str]
    # design §2 "Asynchronous snapshots" (optional, older agents omit them): the job's pause for this checkpoint,
    # the time to serialise + write + hash it, and whether it was an asynchronous snapshot
    stall_s: NotRequired[float]
    write_s: NotRequired[float]
    mode: NotRequired[Literal["sync", "async"]]


class TransferReceived(TypedDict):
    type: Literal["transfer_received"]
    transfer_id: str
    sha256: str
    size_bytes: int


class TransferSent(TypedDict):
    type: Literal["transfer_sent"]
    transfer_id: str
    ok: bool
    attempts: int
    elapsed_s: float
    errors: list[str]


class TransferRejected(TypedDict):
    type: Literal["transfer_rejected"]
    transfer_id: str
    reason: str


class JobStarted(TypedDict):
    type: Literal["job_started"]
    job_id: int
    restored_sequence: int | None
    restored_step: NotRequired[int | None]  # the step of the checkpoint actually restored (work lost from there)


class CheckpointsDropped(TypedDict):
    """The agent no longer holds these checkpoints of a job (pruned, dropped on request, found corrupt)."""

    type: Literal["checkpoints_dropped"]
    msg_id: NotRequired[str]
    job_id: int
    sequences: list[int]
    reason: str


class Received(TypedDict):
    """Portal → agent: the reliable report ``msg_id`` was handled (or refused for good): stop sending it."""

    type: Literal["received"]
    msg_id: str
    refused: NotRequired[bool]


class JobExited(TypedDict):
    type: Literal["job_exited"]
    job_id: int
    returncode: int
    step: int
    result: dict[str, Any]
    reason: str
    output_tail: NotRequired[str]  # the end of what the job printed: a failed job's status quotes its last lines
    step_at: NotRequired[float]  # unix time the job reached ``step`` (its progress record): its step time, §9.9
    paused: NotRequired[list[list[float]]]  # when the run was paused (fenced): [start, end] unix times, §9.9


class JobOutputReport(TypedDict):
    """New output of a running job (stdout+stderr), batched by the agent (design §9.11)."""

    type: Literal["job_output"]
    msg_id: NotRequired[str]
    job_id: int
    text: str  # at most MAX_OUTPUT_TEXT_CHARS; cleaned again by the portal
    skipped_bytes: NotRequired[int]  # output dropped before ``text`` (written faster than it is shipped)
    final: NotRequired[bool]  # the last report of this run (the process ended)


class Ack(TypedDict):
    type: Literal["ack"]
    cmd_id: str
    cmd_ids: NotRequired[list[str]]  # more commands acknowledged at once (a reconnect's burst of re-sends)
    t: float


class KillswitchEngaged(TypedDict):
    type: Literal["killswitch_engaged"]
    reason: str
    t: float


# --- portal → agent (built in portal.control.link.commands) --------------------------------------------------------
class StartJob(TypedDict):
    """Start (or resume from ``restore_sequence``) a job on the node's GPUs (sent by ``workflow.start_on``)."""

    type: Literal["start_job"]
    job_id: int
    command: str
    gpus: list[int]
    interval_s: float
    next_sequence: int
    restore_sequence: int | None
    restore_sha256: str | None
    reason: str
    # Job results (design §14): the directory (relative to the job's work directory, "" for none) the agent
    # uploads to the portal with the final checkpoint when the job ends, and also at each checkpoint if asked.
    output_dir: NotRequired[str]
    upload_with_checkpoints: NotRequired[bool]
    # The fair queue (design §16.6): RECLAIMNET_ARRAY_ID and RECLAIMNET_ARRAY_INDEX for an array's task.
    env: NotRequired[dict[str, str]]
    # Confined jobs (design §19.2): the job's memory limit (bytes, an int) and CPU quota (cores, a float), from
    # ``Job.memory_bytes`` / ``Job.cpu_cores``; each sent only when the job set it (first starts and resumes alike),
    # else absent and the agent applies its own per-GPU default (memory_bytes_per_gpu, cpu_cores_per_gpu).
    memory_bytes: NotRequired[int]
    cpu_cores: NotRequired[float]


class Welcome(TypedDict):
    type: Literal["welcome"]
    node_id: int
    heartbeat_interval_s: float
    heartbeat_timeout_s: float  # silent this long, the node is lost: its agent fences before (design §9.10)
    jobs: list[int]  # the jobs still placed on the node: a fenced agent resumes these and kills the others
    killswitch: bool


class HeartbeatAck(TypedDict):
    """The heartbeat ``seq`` was recorded: the agent has been heard as of when it sent it (design §9.10)."""

    type: Literal["heartbeat_ack"]
    seq: int


class SetRate(TypedDict):
    """P3 re-planned a transfer the node is sending (design §4): pace it at ``rate_bytes_per_s`` from now on."""

    type: Literal["set_rate"]
    transfer_id: str
    rate_bytes_per_s: float
    decision_id: str


UUID_TEXT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def set_rate_fields(transfer_id: str, rate_bytes_per_s: float, decision_id: str) -> dict[str, Any]:
    """The fields of a ``set_rate`` command, checked before it is sent: a transfer id and decision id in
    UUID form and a finite positive rate. Raises :class:`ProtocolError`."""
    if not isinstance(transfer_id, str) or not UUID_TEXT.match(transfer_id):
        raise ProtocolError("set_rate.transfer_id: not a UUID")
    if not isinstance(decision_id, str) or not UUID_TEXT.match(decision_id):
        raise ProtocolError("set_rate.decision_id: not a UUID")
    if (not isinstance(rate_bytes_per_s, int | float) or isinstance(rate_bytes_per_s, bool)
            or not math.isfinite(rate_bytes_per_s) or rate_bytes_per_s <= 0):
        raise ProtocolError("set_rate.rate_bytes_per_s: not a finite positive number")
    return {"transfer_id": transfer_id, "rate_bytes_per_s": float(rate_bytes_per_s), "decision_id": decision_id}


class ErrorReply(TypedDict):
    type: Literal["error"]
    reason: str


_NUM = (int, float)
MAX_CONFINEMENT_CHARS = 400  # Node.job_confinement
SCHEMAS: dict[str, dict[str, Any]] = {
    "hello": {"agent_version": str, "gpus": list, "data_host": str, "data_port": int, "jobs": list},
    "heartbeat": {"seq": int, "gpu_util": list, "egress": dict, "jobs": list},
    "checkpoint_done": {"job_id": int, "sequence": int, "step": int, "size_bytes": int, "sha256": str,
                        "taken_at": _NUM, "final": bool, "compat": dict},
    "transfer_received": {"transfer_id": str, "sha256": str, "size_bytes": int},
    "transfer_sent": {"transfer_id": str, "ok": bool, "attempts": int, "elapsed_s": _NUM, "errors": list},
    "transfer_rejected": {"transfer_id": str, "reason": str},
    "job_started": {"job_id": int},
    "job_exited": {"job_id": int, "returncode": int, "step": int, "result": dict, "reason": str},
    "ack": {"cmd_id": str, "t": _NUM},
    "killswitch_engaged": {"reason": str, "t": _NUM},
    "checkpoints_dropped": {"job_id": int, "sequences": list, "reason": str},
    "job_output": {"job_id": int, "text": str},
}
MAX_LIST_ITEMS = 256
MAX_INT = 2**63 - 1  # PostgreSQL bigint: a larger number would fail in the handler, not be refused here
MAX_CKPT_SECONDS = 7 * 86400.0  # a checkpoint's stall/write/transfer time above a week is not a measurement
CKPT_MODES = ("sync", "async")
MAX_PAUSES = 16  # job_exited.paused: the run's newest pauses (nodeagent/agent.py sends at most this many)
MAX_UNIX_TIME = 2.0**33  # a unix time past this (year 2242) is not a time the agent could have read


def pause_intervals(kind: str, value: Any) -> list[tuple[float, float]]:
    """A report's ``paused`` (design §9.9: when the agent had its run stopped): at most MAX_PAUSES pairs
    [start, end] of finite unix times, each ordered and none before the previous one's end. Raises
    :class:`ProtocolError`."""
    if not isinstance(value, list) or len(value) > MAX_PAUSES:
        raise ProtocolError(f"{kind}.paused: a list of at most {MAX_PAUSES} [start, end] pairs")
    out: list[tuple[float, float]] = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                           and 0 < x < MAX_UNIX_TIME for x in item)):
            raise ProtocolError(f"{kind}.paused: each item a pair of finite unix times")
        start, end = float(item[0]), float(item[1])
        if end < start or (out and start < out[-1][1]):
            raise ProtocolError(f"{kind}.paused: pairs must be ordered and must not overlap")
        out.append((start, end))
    return out


def _check_seconds(kind: str, msg: dict[str, Any], names: tuple[str, ...]) -> None:
    """Optional durations (design §2 "Asynchronous snapshots"): finite numbers in [0, MAX_CKPT_SECONDS]."""
    for name in names:
        if name not in msg:
            continue
        value = msg[name]
        if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
                or not 0 <= value <= MAX_CKPT_SECONDS):
            raise ProtocolError(f"{kind}.{name}: not a finite number of seconds from 0 to {MAX_CKPT_SECONDS:.0f}")


def _check_job_steps(items: list[Any]) -> None:
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("job_id"), int) or isinstance(item["job_id"], bool):
            raise ProtocolError("jobs: each item needs an integer job_id")
        step = item.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool):
            raise ProtocolError("jobs: step must be an integer")
        if not (0 < item["job_id"] <= MAX_INT and -MAX_INT <= step <= MAX_INT):
            raise ProtocolError("jobs: job_id or step out of range")
        if "gpu_util" in item and job_gpu_util(item) is None:
            raise ProtocolError("jobs: gpu_util must be a finite number from 0 to 100")


def job_gpu_util(item: dict[str, Any]) -> float | None:
    """A heartbeat job item's ``gpu_util`` (percent, the mean over the job's GPUs; design §15), or None when
    absent or not a finite number in [0, 100]."""
    value = item.get("gpu_util")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(value) if 0.0 <= value <= 100.0 else None


def _check_held(items: Any) -> None:
    """Only the list's shape: a malformed item (a job may write its own manifests) must not cost the agent its
    hello; :func:`held_items` keeps the well-formed ones."""
    if not isinstance(items, list) or len(items) > MAX_HELD_CHECKPOINTS:
        raise ProtocolError(f"hello.checkpoints: a list of at most {MAX_HELD_CHECKPOINTS} items")


def held_items(items: list[Any]) -> tuple[list[HeldCheckpoint], bool]:
    """The well-formed items of a hello's ``checkpoints`` (job id, sequence ≥ 1, sha256), and whether all were."""
    good: list[HeldCheckpoint] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        job_id, seq, sha = item.get("job_id"), item.get("sequence"), item.get("sha256")
        if (isinstance(job_id, int) and not isinstance(job_id, bool) and 0 < job_id <= MAX_INT
                and isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq <= MAX_INT
                and isinstance(sha, str) and HEX64.match(sha)):
            good.append({"job_id": job_id, "sequence": seq, "sha256": sha})
    return good, len(good) == len(items)


def _check_output(msg: dict[str, Any]) -> None:
    """A job_output report is bounded: its text, its job id, its count of skipped bytes (design §9.11)."""
    if len(msg["text"]) > MAX_OUTPUT_TEXT_CHARS:
        raise ProtocolError(f"job_output.text: more than {MAX_OUTPUT_TEXT_CHARS} characters")
    if not 0 < msg["job_id"] <= MAX_INT:
        raise ProtocolError("job_output.job_id: out of range")
    skipped = msg.get("skipped_bytes", 0)
    if not isinstance(skipped, int) or isinstance(skipped, bool) or not 0 <= skipped <= MAX_INT:
        raise ProtocolError("job_output.skipped_bytes: a non-negative integer")
    if not isinstance(msg.get("final", False), bool):
        raise ProtocolError("job_output.final: a boolean")


def decode(text: str | None, bytes_data: bytes | None) -> dict[str, Any]:
    """Parse one websocket frame into a message object, refusing oversized and non-JSON frames."""
    if text is None:
        raise ProtocolError("binary frames are not accepted")
    if len(text.encode()) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # deeply nested arrays exhaust the parser's recursion
        raise ProtocolError(f"not JSON: {exc.__class__.__name__}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError("message is not a JSON object")
    return obj


def validate(msg: dict[str, Any]) -> str:
    """Check ``msg`` against its type's schema; return the type. Raises :class:`ProtocolError`."""
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in SCHEMAS:
        raise ProtocolError(f"unknown message type {kind!r}")
    for name, typ in SCHEMAS[kind].items():
        value = msg.get(name)
        if value is None or not isinstance(value, typ) or (isinstance(value, bool) and typ in (int, _NUM)):
            raise ProtocolError(f"{kind}.{name}: missing or not {getattr(typ, '__name__', 'a number')}")
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
            raise ProtocolError(f"{kind}.{name}: integer out of range")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"{kind}.{name}: not a finite number")
        if isinstance(value, list) and len(value) > MAX_LIST_ITEMS:
            raise ProtocolError(f"{kind}.{name}: more than {MAX_LIST_ITEMS} items")
    if "jobs" in SCHEMAS[kind]:
        _check_job_steps(msg["jobs"])
    if "msg_id" in msg and (not isinstance(msg["msg_id"], str) or not MSG_ID.match(msg["msg_id"])):
        raise ProtocolError(f"{kind}.msg_id: not 1-64 letters, digits, '_' or '-'")
    if kind == "ack" and "cmd_ids" in msg and (
            not isinstance(msg["cmd_ids"], list) or len(msg["cmd_ids"]) > MAX_LIST_ITEMS
            or not all(isinstance(c, str) and len(c) <= 64 for c in msg["cmd_ids"])):
        raise ProtocolError(f"ack.cmd_ids: at most {MAX_LIST_ITEMS} command ids")
    if kind == "checkpoints_dropped" and not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 < s <= MAX_INT for s in msg["sequences"]):
        raise ProtocolError("checkpoints_dropped.sequences: positive integers")
    if kind == "hello" and "checkpoints" in msg:
        _check_held(msg["checkpoints"])
    if kind == "job_output":
        _check_output(msg)
    if kind == "job_exited" and "paused" in msg:
        pause_intervals(kind, msg["paused"])
    if "sha256" in SCHEMAS[kind] and not HEX64.match(msg["sha256"]):
        raise ProtocolError(f"{kind}.sha256: not 64 lowercase hex digits")
    if kind in ("checkpoint_done", "transfer_received") and msg["size_bytes"] <= 0:
        raise ProtocolError(f"{kind}.size_bytes: must be > 0")
    if kind == "checkpoint_done" and msg["sequence"] < 1:
        raise ProtocolError("checkpoint_done.sequence: must be >= 1")
    if kind == "checkpoint_done" and not 0 <= msg["taken_at"] < 2**33:
        raise ProtocolError("checkpoint_done.taken_at: not a plausible unix time")
    if kind == "checkpoint_done":
        _check_seconds(kind, msg, ("stall_s", "write_s"))
        if "mode" in msg and msg["mode"] not in CKPT_MODES:
            raise ProtocolError("checkpoint_done.mode: one of sync, async")
    if kind == "transfer_sent":
        _check_seconds(kind, msg, ("elapsed_s",))
    if kind == "hello" and not 0 < msg["data_port"] < 65536:
        raise ProtocolError("hello.data_port: out of range")
    if kind == "hello" and "confinement" in msg and not (
            isinstance(msg["confinement"], str) and len(msg["confinement"]) <= MAX_CONFINEMENT_CHARS
            and msg["confinement"].startswith(("confined: ", "unconfined: "))):
        raise ProtocolError(f"hello.confinement: a string of at most {MAX_CONFINEMENT_CHARS} characters starting "
                            "'confined: ' or 'unconfined: '")
    if kind == "heartbeat" and "class_bytes" in msg:  # design §4 "Calibrated reserve": bytes per traffic class
        try:
            check_class_bytes(kind, msg["class_bytes"])
        except ClassBytesError as exc:
            raise ProtocolError(str(exc)) from None
    if kind in ("hello", "heartbeat") and "gpu_state" in msg:  # design §1 "Owner activity and MIG"
        try:
            check_gpu_state(kind, msg["gpu_state"])
        except GpuStateError as exc:
            raise ProtocolError(str(exc)) from None
    return kind
