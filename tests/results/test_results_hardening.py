"""Job results, the reviewed edges (design §14): a job that moved keeps what the node it left uploaded; downloads
stream in bounded chunks from an async iterator; the final chunk is stored once, from a running hash; a node
uploads only within its window and completes once per placement; concurrent uploads reserve against the cap;
results are read under the job page's own rule."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.core.api import views_results
from portal.core.models import JobResultFile, Placement
from portal.core.results_storage import AtomicFileSystemStorage
from portal.core.services import results as svc
from tests.results.conftest import Campus
from tests.results.helpers import asgi_get, complete, put_chunk, sha, streamed_body, streamed_chunks, upload

pytestmark = pytest.mark.django_db


def _move(campus: Campus, ended_ago_s: float = 0.0) -> Placement:
    """End the job's placement on ``node`` and open one on ``other_node`` (a migration A → B)."""
    Placement.objects.filter(job=campus.job, ended_at__isnull=True).update(
        ended_at=timezone.now() - dt.timedelta(seconds=ended_ago_s), end_reason="migrated")
    return Placement.objects.create(job=campus.job, node=campus.other_node, gpu_indices=[0])


def _reader(campus: Campus) -> APIClient:
    client = APIClient()
    client.force_authenticate(campus.users["researcher"])
    return client


# --- a job that moved ----------------------------------------------------------------------------------------------
def test_completing_where_a_job_moved_keeps_the_files_the_node_it_left_uploaded(campus: Campus) -> None:
    assert upload(Client(), campus.token, campus.job.pk, "from-a.txt", b"a").status_code == 201
    _move(campus)
    # the node it left still uploads its working directory (the agent does so when the job stops to move)
    assert upload(Client(), campus.token, campus.job.pk, "late-a.txt", b"late").status_code == 201
    assert complete(Client(), campus.token, campus.job.pk, ["from-a.txt", "late-a.txt"]).status_code == 200
    assert upload(Client(), campus.other_token, campus.job.pk, "from-b.txt", b"b").status_code == 201
    answer = complete(Client(), campus.other_token, campus.job.pk, ["from-b.txt"])
    assert answer.json() == {"state": "complete", "missing": []}
    kept = dict(JobResultFile.objects.values_list("path", "node_id"))
    assert kept == {"from-a.txt": campus.node.pk, "late-a.txt": campus.node.pk, "from-b.txt": campus.other_node.pk}


def test_completing_drops_only_this_nodes_files_no_longer_in_its_directory(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "kept-a.txt", b"a")
    _move(campus)
    upload(Client(), campus.other_token, campus.job.pk, "gone-b.txt", b"b")
    complete(Client(), campus.other_token, campus.job.pk, [])
    assert list(JobResultFile.objects.values_list("path", flat=True)) == ["kept-a.txt"]


# --- downloads stream ----------------------------------------------------------------------------------------------
def test_a_large_download_streams_from_an_async_iterator_in_bounded_chunks(campus: Campus, settings: Any,
                                                                          monkeypatch: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1 << 20
    monkeypatch.setattr(views_results, "DOWNLOAD_CHUNK_BYTES", 64 * 1024)
    data = os.urandom(3 * 2**20 + 5)
    assert upload(Client(), campus.token, campus.job.pk, "big.bin", data).status_code == 201
    response = asgi_get(campus.users["researcher"], f"/api/jobs/{campus.job.pk}/results/files/big.bin")
    assert response.status_code == 200
    assert response.is_async  # ASGI sends it chunk by chunk, not sync_to_async(list)(…) of the whole file
    assert hasattr(response.streaming_content, "__aiter__")
    assert (response["Content-Length"], response["X-Checksum-SHA256"]) == (str(len(data)), sha(data))
    assert response["Content-Disposition"] == 'attachment; filename="big.bin"'
    chunks = streamed_chunks(response)
    assert max(len(c) for c in chunks) <= 64 * 1024
    assert len(chunks) >= len(data) // (64 * 1024)
    assert b"".join(chunks) == data


def test_the_checkpoint_download_streams_too(campus: Campus) -> None:
    ckpt = os.urandom(5000)
    upload(Client(), campus.token, campus.job.pk, "c.ckpt", ckpt, kind="checkpoint", sequence=1)
    response = asgi_get(campus.users["researcher"], f"/api/jobs/{campus.job.pk}/checkpoint/")
    assert response.is_async
    assert streamed_body(response) == ckpt


def test_under_wsgi_a_download_streams_from_a_synchronous_iterator(campus: Campus, monkeypatch: Any) -> None:
    """Django's WSGI path reads an async iterator whole into memory, with a warning: it gets a plain one."""
    monkeypatch.setattr(views_results, "DOWNLOAD_CHUNK_BYTES", 4096)
    data = os.urandom(3 * 4096 + 1)
    assert upload(Client(), campus.token, campus.job.pk, "w.bin", data).status_code == 201
    response = _reader(campus).get(f"/api/jobs/{campus.job.pk}/results/files/w.bin")
    assert response.status_code == 200 and not response.is_async
    chunks = streamed_chunks(response)
    assert [len(c) for c in chunks] == [4096, 4096, 4096, 1]
    assert b"".join(chunks) == data


# --- the final chunk: once, from a running hash --------------------------------------------------------------------
def test_the_final_chunk_needs_no_re_read_of_the_staged_file(campus: Campus, settings: Any,
                                                               monkeypatch: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    reads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append(n) or real_pread(fd, n, off))
    data = os.urandom(3 * 4096 + 17)
    first = put_chunk(Client(), campus.token, campus.job.pk, "a.bin", data[:4096], whole=data)
    assert first.json() == {"complete": False, "offset": 4096}
    [(hashed_bytes, running)] = [entry[1:] for entry in svc._running.values()]
    assert (hashed_bytes, running.copy().hexdigest()) == (4096, sha(data[:4096]))  # kept beside the staging file
    assert upload(Client(), campus.token, campus.job.pk, "a.bin", data, chunk_bytes=4096).status_code == 201
    assert reads == []  # each chunk hashed as it arrived
    assert JobResultFile.objects.get(path="a.bin").sha256 == sha(data)


def test_a_chunk_arriving_after_a_portal_restart_rehashes_the_staged_prefix_once(campus: Campus, settings: Any
                                                                                 ) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    data = os.urandom(2 * 4096 + 3)
    assert put_chunk(Client(), campus.token, campus.job.pk, "a.bin", data[:4096], whole=data).status_code == 200
    svc._running.clear()  # a restart (or another portal process): the running hash is gone
    answer = put_chunk(Client(), campus.token, campus.job.pk, "a.bin", data[4096:8192], offset=4096, whole=data)
    assert answer.status_code == 200, answer.content
    answer = put_chunk(Client(), campus.token, campus.job.pk, "a.bin", data[8192:], offset=8192, whole=data)
    assert answer.status_code == 201, answer.content
    assert JobResultFile.objects.get(path="a.bin").sha256 == sha(data)
    bad = os.urandom(2 * 4096)
    put_chunk(Client(), campus.token, campus.job.pk, "b.bin", bad[:4096], whole=bad)
    svc._running.clear()
    corrupt = put_chunk(Client(), campus.token, campus.job.pk, "b.bin", b"\0" * 4096, offset=4096, whole=bad)
    assert corrupt.status_code == 422


def test_a_final_chunk_retried_while_the_first_is_storing_is_told_to_wait_not_a_500(
        campus: Campus, monkeypatch: Any) -> None:
    data = b"the whole file"
    retried: list[Any] = []
    real_save = AtomicFileSystemStorage._save

    def save_and_retry(storage: Any, name: str, content: Any) -> str:
        if not retried:  # the agent timed out and sends the last (here: empty) chunk again
            retried.append(put_chunk(Client(), campus.token, campus.job.pk, "a.txt", b"", offset=len(data),
                                     whole=data))
        return real_save(storage, name, content)

    monkeypatch.setattr(AtomicFileSystemStorage, "_save", save_and_retry)
    first = put_chunk(Client(), campus.token, campus.job.pk, "a.txt", data)
    assert first.status_code == 201, first.content
    assert (retried[0].status_code, retried[0].json()["code"]) == (503, "storing")
    again = put_chunk(Client(), campus.token, campus.job.pk, "a.txt", b"", offset=len(data), whole=data)
    assert (again.status_code, again.json()["already"]) == (200, True)
    assert JobResultFile.objects.count() == 1
    staging = Path(svc.settings.RECLAIMNET_RESULTS_STAGING_DIR)
    assert not list(staging.glob("*.part")) and not list(staging.glob("*.storing"))


# --- the upload window and one complete per placement --------------------------------------------------------------
def test_a_node_uploads_while_its_placement_is_open_or_within_the_window_after_it(campus: Campus,
                                                                                 settings: Any) -> None:
    settings.RECLAIMNET_RESULTS_UPLOAD_WINDOW_S = 6 * 3600
    _move(campus, ended_ago_s=5 * 3600)
    assert upload(Client(), campus.token, campus.job.pk, "in-time.txt", b"x").status_code == 201
    Placement.objects.filter(job=campus.job, node=campus.node).update(
        ended_at=timezone.now() - dt.timedelta(hours=7))
    late = upload(Client(), campus.token, campus.job.pk, "late.txt", b"y")
    assert (late.status_code, late.json()["code"]) == (403, "upload_window_closed")
    assert complete(Client(), campus.token, campus.job.pk, []).status_code == 403
    assert upload(Client(), campus.other_token, campus.job.pk, "b.txt", b"b").status_code == 201  # open there


def test_complete_counts_once_per_placement(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"a")
    assert complete(Client(), campus.token, campus.job.pk, ["a.txt"]).json()["state"] == "complete"
    repeat = complete(Client(), campus.token, campus.job.pk, [])  # would drop a.txt
    assert (repeat.status_code, repeat.json()["already"]) == (200, True)
    assert list(JobResultFile.objects.values_list("path", flat=True)) == ["a.txt"]


# --- the cap counts bytes being staged -----------------------------------------------------------------------------
def test_concurrent_uploads_reserve_their_bytes_against_the_groups_cap(campus: Campus, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    settings.RECLAIMNET_RESULTS_GROUP_CAP_BYTES = 10_000
    one, two = os.urandom(6000), os.urandom(6000)
    assert put_chunk(Client(), campus.token, campus.job.pk, "one.bin", one[:4096], whole=one).status_code == 200
    refused = put_chunk(Client(), campus.token, campus.job.pk, "two.bin", two[:4096], whole=two)
    assert (refused.status_code, refused.json()["code"]) == (413, "cap_exceeded")
    assert refused.json()["used_bytes"] == 6000  # the bytes reserved by the upload in progress
    resumed = put_chunk(Client(), campus.token, campus.job.pk, "one.bin", one[:4096], whole=one)  # from 0 again
    assert resumed.status_code == 409  # its own reservation does not count against it
    rest = put_chunk(Client(), campus.token, campus.job.pk, "one.bin", one[4096:], offset=4096, whole=one)
    assert rest.status_code == 201, rest.content


# --- who reads -----------------------------------------------------------------------------------------------------
def test_an_owner_who_left_the_group_reads_results_no_more_as_the_job_page_hides_the_job(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"secret")
    campus.group.members.remove(campus.users["researcher"])
    reader = _reader(campus)
    assert reader.get(f"/api/jobs/{campus.job.pk}/").status_code == 404
    for url in (f"/api/jobs/{campus.job.pk}/results/", f"/api/jobs/{campus.job.pk}/results/files/a.txt"):
        assert reader.get(url).status_code == 404, url
