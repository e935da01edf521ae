"""An uploaded campus trace: one JSON file, or the CSV folder as a zip (design §7), checked before anything runs.

Every refusal is an `UploadError` naming the field (``jobs.work_s``, ``trace``, …) and, for a zip, the member it
came from. The tables are checked by the simulator's own loader (``scheduler.sim.trace.from_rows``: columns,
numbers, ranges, references) and the links by the topology (one tree). A zip is read without trusting it: at
most ``MAX_MEMBERS`` members, names that are plain ``TABLE.csv`` (optionally in one folder: no absolute paths,
no ``..``, no nesting), the sum of the declared sizes and of the bytes actually read at most ``max_bytes``.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import zipfile
from typing import Any

from portal.whatif.export import check_tree
from scheduler.sim.trace import OPTIONAL_COLS, TABLES, Trace, TraceError, from_rows, to_json_obj

MAX_MEMBERS = 16
CSV_NAMES = {f"{t}.csv" for t in TABLES} | {"meta.csv"}


class UploadError(ValueError):
    """A refused upload: ``field`` as the simulator names it, ``file`` the zip member (or the upload) concerned."""

    def __init__(self, field: str, message: str, file: str = "") -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.file = field, message, file

    def as_dict(self) -> dict[str, str]:
        out = {"field": self.field, "detail": self.message}
        if self.file:
            out["file"] = self.file
        return out


def _checked(rows: Any, file: str) -> Trace:
    try:
        trace = from_rows(rows)
        check_tree(trace)
    except TraceError as e:
        raise UploadError(e.field, e.message, file) from None
    return trace


def parse_json(data: bytes, name: str = "trace.json") -> Trace:
    try:
        rows = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UploadError("trace", f"not a JSON document: {getattr(e, 'msg', None) or e.reason}", name) from None
    return _checked(rows, name)


def _member_name(info: zipfile.ZipInfo) -> str:
    name = info.filename
    if "\\" in name or name.startswith("/") or ".." in name.split("/") or ":" in name.split("/")[0]:
        raise UploadError("trace", f"member {name!r} points outside the archive", name)
    parts = [p for p in posixpath.normpath(name).split("/") if p not in ("", ".")]
    if info.is_dir():
        if len(parts) > 1:
            raise UploadError("trace", f"nested folder {name!r}: put the CSV files at the top or in one folder", name)
        return ""
    if len(parts) > 2:
        raise UploadError("trace", f"nested member {name!r}: put the CSV files at the top or in one folder", name)
    base = parts[-1]
    if base not in CSV_NAMES:
        raise UploadError("trace", f"unexpected member {name!r}; one of {', '.join(sorted(CSV_NAMES))}", name)
    return base


def parse_zip(data: bytes, name: str = "trace.zip", max_bytes: int = 64 * 2**20) -> Trace:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise UploadError("trace", "not a zip archive", name) from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UploadError("trace", f"{len(infos)} members; at most {MAX_MEMBERS}", name)
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            base = _member_name(info)
            if not base:
                continue
            if base in members:
                raise UploadError("trace", f"{base} appears twice", info.filename)
            members[base] = info
        declared = sum(i.file_size for i in members.values())
        if declared > max_bytes:
            raise UploadError("trace", f"{declared} bytes uncompressed; at most {max_bytes}", name)
        rows: dict[str, Any] = {}
        budget = max_bytes
        for base, info in members.items():
            try:
                with archive.open(info) as fh:
                    raw = fh.read(budget + 1)  # never more than the budget, whatever the header claims
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as e:
                raise UploadError("trace", f"cannot read {info.filename}: {e}", info.filename) from None
            if len(raw) > budget:
                raise UploadError("trace", f"more than {max_bytes} bytes uncompressed", info.filename)
            budget -= len(raw)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise UploadError("trace", "not UTF-8 text", info.filename) from None
            table = base.removesuffix(".csv")
            reader = csv.DictReader(io.StringIO(text))
            try:
                if table == "meta":
                    for r in reader:
                        if r.get("key") == "horizon_s":
                            rows["horizon_s"] = r.get("value")
                    continue
                header = reader.fieldnames or []
                parsed = [{k: v for k, v in r.items() if k is not None and (v != "" or k != "return_s")}
                          for r in reader]
            except csv.Error as e:
                raise UploadError(table, f"bad CSV: {e}", info.filename) from None
            for col in TABLES[table]:  # a header without rows still names what is missing
                if col not in header and not parsed and (table, col) not in OPTIONAL_COLS:
                    raise UploadError(f"{table}.{col}", "missing column", info.filename)
            rows[table] = parsed
    try:
        trace = from_rows(rows)
        check_tree(trace)
    except TraceError as e:
        table = e.field.split(".")[0]
        member = next((i.filename for b, i in members.items() if b == f"{table}.csv"), name)
        raise UploadError(e.field, e.message, member) from None
    return trace


def parse_upload(data: bytes, name: str, max_upload_bytes: int, max_trace_bytes: int) -> Trace:
    """A JSON file or a zip of the CSV folder (told apart by their first bytes, not their names): at most
    ``max_upload_bytes`` as sent, ``max_trace_bytes`` once unzipped."""
    if len(data) > max_upload_bytes:
        raise UploadError("trace", f"{len(data)} bytes; at most {max_upload_bytes}", name)
    if not data.strip():
        raise UploadError("trace", "the file is empty", name)
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return parse_zip(data, name, max_trace_bytes)
    return parse_json(data, name)


def rows_of(trace: Trace) -> dict[str, Any]:
    """The trace as design §7 JSON rows (what an evaluation stores)."""
    return to_json_obj(trace)
