"""Job results: receiving the agent's uploads, capping them per research group, reading and pruning them
(design §14).

Upload protocol (agent → portal, HTTP, the node's agent token as ``Authorization: Bearer``; the views are in
``portal/core/api/views_results.py``): each file goes in chunks of at most :func:`chunk_bytes` (the request
body limit), ``PUT …/results/<files|checkpoint>/<path>`` with the whole file's ``X-Checksum-SHA256`` and
``X-Total-Size`` and the chunk's ``X-Offset``. Chunks are appended to a staging file named after the job, the
path and the sha256, so an upload interrupted by an agent or portal restart resumes where the staging file
ends (a wrong offset answers 409 with the right one). Each chunk is hashed as it arrives (a running sha256);
with the last chunk the staging file is renamed to ``.storing`` under its lock, so one request alone compares
the hash: a mismatch discards the bytes (422, the agent sends the file again); a match stores the file,
content-addressed, through the ``results`` storage and records it (a retried last chunk meanwhile: 503). Re-sending a file already kept answers 200 and changes
nothing. The group's cap (counting the bytes its other uploads are staging) is checked before the first
chunk is staged and again when the file is recorded
(under a lock on the group's row): a file past it is refused with 413 naming the cap, and the job's results
say so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from portal.core import permissions
from portal.core.models import (
    GroupResultsCap,
    Job,
    JobResultFile,
    JobResults,
    Placement,
    ResearchGroup,
    ResultKind,
    ResultsState,
)
from portal.core.results_storage import results_storage

log = logging.getLogger(__name__)

MAX_PATH_CHARS = 1024
MAX_PATH_SEGMENTS = 64
MAX_OUTPUT_DIR_CHARS = 500
MAX_FILE_BYTES = 10 * 2**40  # 10 TiB, as a checkpoint estimate
MAX_FILES_PER_JOB = 10_000
HEX64 = re.compile(r"^[0-9a-f]{64}$")
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
PRUNE_BATCH = 2000  # files deleted per housekeeping pass (the rest go in the next)


# --- paths ---------------------------------------------------------------------------------------------------------
def _segments(value: str) -> list[str] | str:
    """The path's segments, or why it is refused."""
    if _BAD_CHARS.search(value):
        return "Control characters and backslashes are not allowed."
    if value.startswith("/") or re.match(r"^[A-Za-z]:", value):
        return "Must be relative to the job's working directory, not an absolute path."
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return "'..' is not allowed: the path must stay inside the job's working directory."
    if parts and parts[0].startswith("~"):
        return "'~' is not allowed: the path is relative to the job's working directory."
    return parts


def clean_output_dir(value: Any) -> str:
    """A job's ``output_dir``: "" (none), or a directory relative to its working directory ("." is all of it).
    Raises ``ValidationError({"output_dir": [...]})`` for an absolute path, ``..`` and the like."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError({"output_dir": ["A string is required."]})
    value = value.strip()
    if not value:
        return ""
    if len(value) > MAX_OUTPUT_DIR_CHARS:
        raise ValidationError({"output_dir": [f"Ensure this field has no more than {MAX_OUTPUT_DIR_CHARS} "
                                              "characters."]})
    parts = _segments(value)
    if isinstance(parts, str):
        raise ValidationError({"output_dir": [parts]})
    return "/".join(parts) or "."


def clean_result_path(value: Any, field_name: str = "path") -> str:
    """A file's path inside a job's results: relative, no ``..``, no empty or control characters.
    Raises ``ValidationError({field_name: [...]})``."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError({field_name: ["A file path is required."]})
    if len(value) > MAX_PATH_CHARS:
        raise ValidationError({field_name: [f"Longer than {MAX_PATH_CHARS} characters."]})
    parts = _segments(value)
    if isinstance(parts, str):
        raise ValidationError({field_name: [parts]})
    if not parts:
        raise ValidationError({field_name: ["A file path is required."]})
    if len(parts) > MAX_PATH_SEGMENTS:
        raise ValidationError({field_name: [f"More than {MAX_PATH_SEGMENTS} directories deep."]})
    return "/".join(parts)


# --- the group's cap -----------------------------------------------------------------------------------------------
def group_cap_bytes(group_id: int) -> int:
    """The group's own cap (admin-editable), else ``RECLAIMNET_RESULTS_GROUP_CAP_BYTES``."""
    own = GroupResultsCap.objects.filter(group_id=group_id).values_list("cap_bytes", flat=True).first()
    return int(own if own is not None else settings.RECLAIMNET_RESULTS_GROUP_CAP_BYTES)


def group_used_bytes(group_id: int, excluding: int | None = None) -> int:
    """Bytes of results the group keeps now (``excluding`` one file row, the one an upload replaces)."""
    rows = JobResultFile.objects.filter(job__group_id=group_id)
    if excluding is not None:
        rows = rows.exclude(pk=excluding)
    return int(rows.aggregate(total=Sum("size_bytes"))["total"] or 0)


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


def cap_message(group_name: str, cap_bytes: int, used_bytes: int, size_bytes: int, path: str) -> str:
    return (f"Results cap of research group {group_name!r} reached: the cap is {cap_bytes} bytes "
            f"({format_bytes(cap_bytes)}), {used_bytes} bytes are kept and {path!r} has {size_bytes} bytes. "
            "Delete old results or ask an admin to raise the group's results cap.")


# --- the agent's side ----------------------------------------------------------------------------------------------
@dataclass
class Answer:
    """What an agent endpoint answers: HTTP status and JSON body."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


class ResultsRefusedError(Exception):
    def __init__(self, status: int, detail: str, code: str, **extra: Any) -> None:
        super().__init__(detail)
        self.answer = Answer(status, {"detail": detail, "code": code, **extra})


def chunk_bytes() -> int:
    """The largest chunk an agent may send in one request (the portal's request body limit)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440
    return int(min(limit, 8 * 2**20))


def upload_window_s() -> float:
    """How long after its placement on a node ended that node may still upload the job's results."""
    return float(settings.RECLAIMNET_RESULTS_UPLOAD_WINDOW_S)


def placement_for_agent(node_id: int, job_id: int) -> Placement:
    """The job's newest placement on this node, while it is open or ended less than :func:`upload_window_s`
    ago (a job that moved on uploads from the node it left, too); else 404 (never ran here) or 403 (too late)."""
    placement = (Placement.objects.filter(job_id=job_id, node_id=node_id).select_related("job__group")
                 .order_by("-started_at", "-id").first())
    if placement is None:
        raise ResultsRefusedError(404, f"Job {job_id} did not run on this node.", "not_found")
    if placement.ended_at is not None and \
            placement.ended_at < timezone.now() - dt.timedelta(seconds=upload_window_s()):
        raise ResultsRefusedError(403, f"Job {job_id} left this node more than {upload_window_s():.0f} s ago: "
                                  "its results are no longer accepted from it.", "upload_window_closed")
    return placement


def job_for_agent(node_id: int, job_id: int) -> Job:
    """The job, if this node may upload its results now (see :func:`placement_for_agent`)."""
    return placement_for_agent(node_id, job_id).job


def agent_manifest(node_id: int, job_id: int) -> Answer:
    """What the portal keeps of the job (the agent skips files it already holds: resuming after a restart)."""
    job = job_for_agent(node_id, job_id)
    files = {}
    checkpoint = None
    for kind, path, sha, seq in JobResultFile.objects.filter(job=job).values_list(
            "kind", "path", "sha256", "checkpoint_sequence"):
        if kind == ResultKind.CHECKPOINT:
            checkpoint = {"path": path, "sha256": sha, "sequence": seq}
        else:
            files[path] = sha
    state = JobResults.objects.filter(job=job).values_list("state", flat=True).first() or ResultsState.NONE
    return Answer(200, {"files": files, "checkpoint": checkpoint, "state": state, "chunk_bytes": chunk_bytes()})


def _staging_path(job: Job, kind: str, path: str, sha256: str, size: int) -> Path:
    """``g<group>-job<job>-<path key>-<sha256>-<size>.part``: the name says whose cap the staged bytes are
    reserved from and how many (see :func:`group_staged_bytes`)."""
    root = Path(settings.RECLAIMNET_RESULTS_STAGING_DIR)
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{kind}\0{path}".encode()).hexdigest()[:24]
    return root / f"g{job.group_id}-job{job.pk}-{key}-{sha256}-{size}.part"


def _storing_path(staging: Path) -> Path:
    """Where the final chunk's request moves a complete staging file while it stores it (only one does)."""
    return staging.with_suffix(".storing")


def group_staged_bytes(group_id: int, excluding: Path | None = None) -> int:
    """Bytes reserved by the group's uploads in progress: the announced sizes of its staging files (those
    being staged and those being stored), so concurrent uploads cannot each stage up to the cap."""
    root = Path(settings.RECLAIMNET_RESULTS_STAGING_DIR)
    if not root.is_dir():
        return 0
    skip = {excluding, _storing_path(excluding)} if excluding is not None else set()
    total = 0
    for pattern in (f"g{group_id}-job*.part", f"g{group_id}-job*.storing"):
        for part in root.glob(pattern):
            if part in skip:
                continue
            with contextlib.suppress(ValueError):
                total += int(part.stem.rsplit("-", 1)[1])
    return total


# The running sha256 of each staging file, hashed chunk by chunk as it arrives, so the final chunk needs no
# re-read of the whole file. Process-local (hashlib's state cannot be written out): a chunk that reaches another
# portal process, or arrives after a restart, re-hashes the staged prefix once and goes on from there.
_RUNNING_MAX = 256
_running: OrderedDict[str, tuple[int, int, Any]] = OrderedDict()  # path -> (inode, bytes hashed, sha256)
_running_lock = threading.Lock()


def _running_hash(staging: Path, fd: int, staged: int) -> Any:
    """The sha256 of the first ``staged`` bytes of the open staging file ``fd`` (from the cache, else read)."""
    inode = os.fstat(fd).st_ino
    with _running_lock:
        cached = _running.pop(str(staging), None)
    if cached is not None and cached[0] == inode and cached[1] == staged:
        return cached[2]
    digest = hashlib.sha256()
    done = 0
    while done < staged:
        block = os.pread(fd, min(1 << 20, staged - done), done)
        if not block:
            break
        digest.update(block)
        done += len(block)
    return digest


def _keep_running_hash(staging: Path, fd: int, staged: int, digest: Any) -> None:
    with _running_lock:
        _running[str(staging)] = (os.fstat(fd).st_ino, staged, digest)
        while len(_running) > _RUNNING_MAX:
            _running.popitem(last=False)


def _forget_running_hash(staging: Path) -> None:
    with _running_lock:
        _running.pop(str(staging), None)


def _header_int(value: Any, name: str, maximum: int) -> int:
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        raise ResultsRefusedError(400, f"{name}: an integer is required.", "bad_request", field=name) from None
    if not 0 <= number <= maximum:
        raise ResultsRefusedError(400, f"{name}: must be between 0 and {maximum}.", "bad_request", field=name)
    return number


def receive_chunk(node_id: int, job_id: int, kind: str, raw_path: str, *, sha256: Any, total_size: Any,
                  offset: Any, data: bytes, checkpoint_sequence: Any = None) -> Answer:
    """One chunk of one file from a node's agent (see the module docstring). Returns the answer; raises
    :class:`ResultsRefusedError` (its ``answer``) and ``ValidationError`` (400 naming ``path``)."""
    path = clean_result_path(raw_path)
    if kind not in ResultKind.values:
        raise ResultsRefusedError(404, f"Unknown kind of result {kind!r}.", "not_found")
    sha = str(sha256 or "").lower()
    if not HEX64.match(sha):
        raise ResultsRefusedError(400, "X-Checksum-SHA256: the whole file's sha256 as 64 hex digits is required.",
                      "bad_request", field="X-Checksum-SHA256")
    size = _header_int(total_size, "X-Total-Size", MAX_FILE_BYTES)
    start = _header_int(offset, "X-Offset", size)
    sequence = None
    if kind == ResultKind.CHECKPOINT:
        sequence = _header_int(checkpoint_sequence, "X-Checkpoint-Sequence", 2**31 - 1)
    if start + len(data) > size:
        raise ResultsRefusedError(400, f"The chunk ends at {start + len(data)}, past the file's {size} bytes.", "bad_request",
                      field="X-Offset")
    job = job_for_agent(node_id, job_id)
    already = Answer(200, {"complete": True, "already": True, "path": path, "size_bytes": size, "sha256": sha})
    held = JobResultFile.objects.filter(job=job, kind=kind, path=path).values_list("pk", "sha256").first()
    if held is not None and held[1] == sha:
        return already
    staging = _staging_path(job, kind, path, sha, size)
    storing = _storing_path(staging)
    if start == 0 and not staging.exists():
        _reserve(job, path, size, staging, replacing=held[0] if held else None)
    with open(staging, "a+b") as out:  # read too: a running hash lost to a restart re-reads the prefix
        fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # a retried chunk racing its first copy waits, then sees it
        if not _is_current(out.fileno(), staging) or storing.exists():
            # the complete file was taken for storing by another request (a retried final chunk)
            if out.tell() == 0 and _is_current(out.fileno(), staging):
                staging.unlink(missing_ok=True)  # the empty file this request created
            if JobResultFile.objects.filter(job=job, kind=kind, path=path, sha256=sha).exists():
                return already
            return Answer(503, {"detail": f"{path!r} is being stored; ask again shortly.", "code": "storing"})
        staged = out.seek(0, os.SEEK_END)
        if staged != start:
            return Answer(409, {"detail": f"Expected the chunk at offset {staged}, not {start}.",
                                "code": "offset_mismatch", "offset": staged})
        digest = _running_hash(staging, out.fileno(), staged)
        out.write(data)
        out.flush()
        digest.update(data)
        staged += len(data)
        if staged < size:
            _keep_running_hash(staging, out.fileno(), staged, digest)
            return Answer(200, {"complete": False, "offset": staged})
        _forget_running_hash(staging)
        os.rename(staging, storing)  # under the lock: only this request stores the file
    try:
        return _store(job, node_id, kind, path, sha, size, storing, digest.hexdigest(), sequence)
    finally:
        storing.unlink(missing_ok=True)


def _is_current(fd: int, staging: Path) -> bool:
    """Whether the open file ``fd`` is still the one named ``staging`` (not renamed away meanwhile)."""
    try:
        return os.fstat(fd).st_ino == os.stat(staging).st_ino
    except FileNotFoundError:
        return False


def _reserve(job: Job, path: str, size: int, staging: Path, replacing: int | None) -> None:
    """Check the group's cap against what it keeps plus what its other uploads are staging, and reserve
    ``size`` bytes by creating the staging file, under a lock on the group's row (design §14)."""
    with transaction.atomic():
        ResearchGroup.objects.select_for_update().filter(pk=job.group_id).first()
        cap = group_cap_bytes(job.group_id)
        used = group_used_bytes(job.group_id, excluding=replacing) + group_staged_bytes(job.group_id, staging)
        refused = used + size > cap
        if not refused:
            staging.touch()
    if refused:  # noted outside the transaction the refusal would roll back
        message = cap_message(job.group.name, cap, used, size, path)
        _note_refusal(job.pk, message)
        raise ResultsRefusedError(413, message, "cap_exceeded", cap_bytes=cap, used_bytes=used)


def _note_refusal(job_id: int, message: str) -> None:
    results, _ = JobResults.objects.get_or_create(job_id=job_id)
    JobResults.objects.filter(pk=results.pk).update(refused_reason=message[:500], state=ResultsState.PARTIAL,
                                                    updated_at=timezone.now())


def storage_name(job_id: int, sha256: str) -> str:
    return f"jobs/{job_id}/{sha256}"


def _store(job: Job, node_id: int, kind: str, path: str, sha: str, size: int, staging: Path, actual: str,
           sequence: int | None) -> Answer:
    """The last chunk arrived (``actual``: the running sha256 of the staged bytes): verify, store, record it
    (cap re-checked under the group lock). The caller removes ``staging`` afterwards."""
    if actual != sha:
        log.warning("job %s result %r refused: sha256 %s, %s announced", job.pk, path, actual, sha)
        raise ResultsRefusedError(422, f"sha256 mismatch for {path!r}: the bytes received hash to {actual}, not {sha}; "
                           "send the file again.", "checksum_mismatch")
    name = storage_name(job.pk, sha)
    storage = results_storage()
    with open(staging, "rb") as fh:
        storage.save(name, File(fh, name=os.path.basename(name)))
    replaced_name = None
    with transaction.atomic():
        ResearchGroup.objects.select_for_update().filter(pk=job.group_id).first()  # one upload of a group at a time
        row = JobResultFile.objects.filter(job=job, kind=kind, path=path).first()
        cap = group_cap_bytes(job.group_id)
        used = group_used_bytes(job.group_id, excluding=row.pk if row else None)
        if used + size > cap:
            message = cap_message(job.group.name, cap, used, size, path)
            refused = message
        else:
            refused = None
            if kind == ResultKind.CHECKPOINT:  # one final checkpoint per job: the newest replaces the others
                for old in JobResultFile.objects.filter(job=job, kind=kind).exclude(path=path):
                    _forget_after_commit(old.storage_name, job.pk)
                    old.delete()
            if row is None:
                row = JobResultFile(job=job, kind=kind, path=path)
            elif row.storage_name != name:
                replaced_name = row.storage_name
            row.size_bytes, row.sha256, row.storage_name = size, sha, name
            row.checkpoint_sequence, row.node_id = sequence, node_id
            row.save()
            results, _ = JobResults.objects.select_for_update().get_or_create(job=job)
            if results.state == ResultsState.NONE:
                results.state = ResultsState.PARTIAL
            results.total_bytes = int(JobResultFile.objects.filter(job=job).aggregate(t=Sum("size_bytes"))["t"] or 0)
            results.save(update_fields=["state", "total_bytes", "updated_at"])
    if refused is not None:
        _forget_after_commit(name, job.pk)
        _note_refusal(job.pk, refused)
        raise ResultsRefusedError(413, refused, "cap_exceeded", cap_bytes=cap, used_bytes=used)
    if replaced_name is not None:
        _forget_after_commit(replaced_name, job.pk)
    return Answer(201, {"complete": True, "already": False, "path": path, "size_bytes": size, "sha256": sha})


def _forget_after_commit(name: str, job_id: int) -> None:
    """Delete a stored object once no row of the job names it (content-addressed: two paths may share one)."""

    def forget() -> None:
        if not JobResultFile.objects.filter(storage_name=name).exists():
            with contextlib.suppress(OSError):
                results_storage().delete(name)

    transaction.on_commit(forget)


def complete(node_id: int, job_id: int, files: Any, checkpoint: Any) -> Answer:
    """The agent uploaded everything it found: ``files`` (paths) is the output directory on this node as it is
    now, so files uploaded from this node and no longer in it are dropped (files uploaded from another node the
    job ran on stay: each node has its own working directory); the results are complete when every listed file
    is kept. Once per placement: a repeat answers the state and changes nothing."""
    if not isinstance(files, list) or len(files) > MAX_FILES_PER_JOB:
        raise ValidationError({"files": [f"A list of at most {MAX_FILES_PER_JOB} paths is required."]})
    paths = {clean_result_path(p, "files") for p in files}
    placement = placement_for_agent(node_id, job_id)
    job = placement.job
    with transaction.atomic():
        results, _ = JobResults.objects.select_for_update().get_or_create(job=job)
        if placement.pk in (results.completed_placements or []):
            return Answer(200, {"state": results.state, "missing": [], "already": True})
        results.completed_placements = [*(results.completed_placements or []), placement.pk]
        stale = (JobResultFile.objects.filter(job=job, kind=ResultKind.OUTPUT, node_id=node_id)
                 .exclude(path__in=paths))
        for row in stale:
            _forget_after_commit(row.storage_name, job.pk)
        stale.delete()
        kept = set(JobResultFile.objects.filter(job=job, kind=ResultKind.OUTPUT).values_list("path", flat=True))
        missing = sorted(paths - kept)
        has_ckpt = JobResultFile.objects.filter(job=job, kind=ResultKind.CHECKPOINT).exists()
        if checkpoint and not has_ckpt:
            missing.append(str(checkpoint)[:MAX_PATH_CHARS])
        results.state = ResultsState.PARTIAL if missing else ResultsState.COMPLETE
        if not missing:
            results.refused_reason = ""
            results.completed_at = timezone.now()
        results.total_bytes = int(JobResultFile.objects.filter(job=job).aggregate(t=Sum("size_bytes"))["t"] or 0)
        results.save()
    return Answer(200, {"state": results.state, "missing": missing[:100]})


# --- readers -------------------------------------------------------------------------------------------------------
def readable_jobs(user: Any) -> Any:
    """Jobs whose results ``user`` may read: the jobs the job page shows them (``permissions.visible_jobs``:
    members of the job's group, admins)."""
    return permissions.visible_jobs(user)


def download_url(job_id: int, path: str) -> str:
    """Where a kept file is read (its path percent-encoded: names may hold spaces, '#', '?')."""
    return f"/api/jobs/{job_id}/results/files/{quote(path, safe='/')}"


def listing(job_id: int) -> dict[str, Any]:
    """``GET /api/jobs/{id}/results/``: the job's files (not the checkpoint), their total, the state."""
    rows = list(JobResultFile.objects.filter(job_id=job_id, kind=ResultKind.OUTPUT).order_by("path")
                .values_list("path", "size_bytes", "sha256"))
    state = JobResults.objects.filter(job_id=job_id).values_list("state", flat=True).first() or ResultsState.NONE
    files = [{"path": p, "size_bytes": size, "sha256": sha, "download_url": download_url(job_id, p)}
             for p, size, sha in rows]
    return {"files": files, "total_bytes": sum(f["size_bytes"] for f in files), "state": state}


def open_file(job_id: int, kind: str, path: str | None = None) -> tuple[BinaryIO, JobResultFile] | None:
    """The stored bytes of one kept file (the job's checkpoint when ``kind`` is checkpoint), or None."""
    rows = JobResultFile.objects.filter(job_id=job_id, kind=kind)
    if path is not None:
        rows = rows.filter(path=path)
    row = rows.order_by("-uploaded_at").first()
    if row is None:
        return None
    try:
        return results_storage().open(row.storage_name, "rb"), row
    except (OSError, FileNotFoundError):
        log.warning("job %s result %r is recorded but missing from the storage", job_id, row.path)
        return None


def page_results(job_id: int) -> dict[str, Any]:
    """The job page's results section, in one query: the summary row LEFT JOINed with the files."""
    rows = list(JobResults.objects.filter(job_id=job_id).values(
        "state", "total_bytes", "refused_reason", "job__result_files__kind", "job__result_files__path",
        "job__result_files__size_bytes").order_by("job__result_files__kind", "job__result_files__path"))
    if not rows:
        return {"state": ResultsState.NONE, "files": [], "checkpoint": None, "total_bytes": 0, "refused_reason": ""}
    head = rows[0]
    files, checkpoint = [], None
    for r in rows:
        if r["job__result_files__path"] is None:
            continue
        item = {"path": r["job__result_files__path"], "size_bytes": r["job__result_files__size_bytes"]}
        if r["job__result_files__kind"] == ResultKind.CHECKPOINT:
            checkpoint = {**item, "url": f"/api/jobs/{job_id}/checkpoint/"}
        else:
            files.append({**item, "url": download_url(job_id, item["path"])})
    return {"state": head["state"], "files": files, "checkpoint": checkpoint, "total_bytes": head["total_bytes"],
            "refused_reason": head["refused_reason"]}


# --- housekeeping --------------------------------------------------------------------------------------------------
def prune_old_results(now: dt.datetime | None = None) -> int:
    """Delete the results of jobs that ended more than ``RECLAIMNET_RESULTS_KEEP_DAYS`` ago (stored objects
    first, then their rows; at most PRUNE_BATCH files a pass); stale staging files go too."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=float(settings.RECLAIMNET_RESULTS_KEEP_DAYS))
    old = JobResultFile.objects.filter(job__finished_at__lt=cutoff)
    rows = list(old.values_list("pk", "storage_name", "job_id")[:PRUNE_BATCH])
    storage = results_storage()
    for name in {name for _, name, _ in rows}:
        with contextlib.suppress(OSError):
            storage.delete(name)
    JobResultFile.objects.filter(pk__in=[pk for pk, _, _ in rows]).delete()
    JobResults.objects.filter(job__finished_at__lt=cutoff, job__result_files__isnull=True).delete()
    _prune_staging(now)
    return len(rows)


def _prune_staging(now: dt.datetime) -> None:
    """Staging files untouched for a day belong to uploads nobody will resume."""
    root = Path(settings.RECLAIMNET_RESULTS_STAGING_DIR)
    if not root.is_dir():
        return
    limit = now.timestamp() - 86400.0
    for part in [*root.glob("*.part"), *root.glob("*.storing")]:
        with contextlib.suppress(OSError):
            if part.stat().st_mtime < limit:
                part.unlink()
