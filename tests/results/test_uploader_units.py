"""The agent's side of job results, without a portal (design §14): which directory, which files, when, and the
queue that survives a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nodeagent import jobkit
from nodeagent.results import ResultsUploader, http_base, list_files, output_root, retry_delay_s


def test_the_output_directory_must_stay_inside_the_work_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "link").symlink_to(tmp_path)  # a job's symlink pointing out of its work directory
    assert output_root(work, "out") == (work / "out").resolve()
    assert output_root(work, ".") == work.resolve()
    for bad in ("", "/etc", "../x", "out/../../x", "link", "a\x00b"):
        assert output_root(work, bad) is None, bad


def test_only_regular_files_are_listed_never_through_a_symlink(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (root / "secret").symlink_to("/etc/hostname")
    (root / "dirlink").symlink_to(tmp_path)
    (root / "half.tmp").write_text("being written")
    assert [rel for rel, _ in list_files(root)] == ["a.txt", "sub/b.txt"]


def test_the_http_base_follows_the_websocket_url() -> None:
    assert http_base("ws://127.0.0.1:8000/ws/agent/") == "http://127.0.0.1:8000"
    assert http_base("wss://portal.campus:443/ws/agent/") == "https://portal.campus:443"


def test_retries_back_off_exponentially_with_full_jitter_and_a_cap() -> None:
    assert retry_delay_s(1, 0.0) == pytest.approx(0.5)
    assert retry_delay_s(3, 1.0) == pytest.approx(8.0)
    assert retry_delay_s(30, 1.0) == pytest.approx(300.0)


def test_a_final_upload_replaces_a_queued_interim_one_never_the_reverse_and_the_queue_survives_a_restart(
        tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    uploader = ResultsUploader(tmp_path / "agent", "ws://127.0.0.1:1/ws/agent/", "tok")
    assert uploader.enqueue("7", work, "out", final=False)
    assert uploader.enqueue("7", work, "out", final=True, ckpt_dir=tmp_path / "ckpt")
    assert not uploader.enqueue("7", work, "out", final=False)
    assert not uploader.enqueue("8", work, "../out", final=True)
    restarted = ResultsUploader(tmp_path / "agent", "ws://127.0.0.1:1/ws/agent/", "tok")
    task = restarted.tasks["7"]
    assert (task.final, task.ckpt_dir, task.root) == (True, str(tmp_path / "ckpt"), str((work / "out").resolve()))


def _agent_with_run(tmp_path: Path, stop_reason: str = "", upload_with_checkpoints: bool = False) -> Any:
    from nodeagent.agent import Agent

    queued: list[tuple[str, bool, bool]] = []  # (output_dir, final, with the checkpoint)
    agent = SimpleNamespace(results=SimpleNamespace(
        enqueue=lambda job_id, work_dir, output_dir, final, ckpt_dir=None: queued.append(
            (output_dir, final, ckpt_dir is not None))))
    run = SimpleNamespace(output_dir="out", stop_reason=stop_reason, work_dir=tmp_path, ckpt_dir=tmp_path / "c",
                          upload_with_checkpoints=upload_with_checkpoints)
    return Agent, agent, run, queued


@pytest.mark.parametrize("code,stop_reason,queued_upload", [
    (0, "", [("out", True, True)]),  # completed: the directory and the final checkpoint
    (1, "", [("out", True, True)]),  # failed: its outputs help to see why
    # moving elsewhere: this node's working directory stays behind, so its files go now (the checkpoint moves)
    (jobkit.EXIT_CHECKPOINTED, "checkpointed for migration", [("out", True, False)]),
    (jobkit.EXIT_CHECKPOINTED, "", [("out", True, False)]),
    (-9, "reclaim deadline", []),
    (-9, "cancelled", []),
])
def test_results_are_uploaded_when_a_job_ends_on_its_own_or_stops_to_move_never_when_cancelled(
        tmp_path: Path, code: int, stop_reason: str, queued_upload: list[tuple[str, bool, bool]]) -> None:
    agent_cls, agent, run, queued = _agent_with_run(tmp_path, stop_reason)
    agent_cls._queue_results(agent, "5", run, code, final=True)
    assert queued == queued_upload


def test_a_file_swapped_for_a_symlink_after_listing_is_not_read(tmp_path: Path) -> None:
    from nodeagent.results import NotRegularFileError, _read_at, file_digest, open_regular

    root = tmp_path / "out"
    root.mkdir()
    (root / "a.txt").write_text("mine")
    listed = list_files(root)
    assert [rel for rel, _ in listed] == ["a.txt"]
    secret = tmp_path / "secret"
    secret.write_text("not the job's")
    (root / "a.txt").unlink()
    (root / "a.txt").symlink_to(secret)  # swapped between the listing and the read
    for read in (lambda p: file_digest(p), lambda p: _read_at(p, 0, 100), open_regular):
        with pytest.raises(NotRegularFileError):
            read(listed[0][1])
    with pytest.raises(FileNotFoundError):  # what the uploader skips a vanished file on
        file_digest(listed[0][1])
    os.mkfifo(root / "fifo")
    with pytest.raises(NotRegularFileError):
        open_regular(root / "fifo")


def test_a_job_without_an_output_dir_uploads_nothing(tmp_path: Path) -> None:
    agent_cls, agent, run, queued = _agent_with_run(tmp_path)
    run.output_dir = ""
    agent_cls._queue_results(agent, "5", run, 0, final=True)
    assert queued == []


def test_s3_storage_is_chosen_by_the_bucket_setting_without_needing_boto3_otherwise(tmp_path: Path) -> None:
    code = ("import django; from django.conf import settings; django.setup(); "
            "print(settings.STORAGES['results']['BACKEND'])")
    base = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "RECLAIMNET_TESTING": "1",
            "RECLAIMNET_RESULTS_S3_BUCKET": ""}
    plain = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip().endswith("AtomicFileSystemStorage"), plain.stderr[-500:]
    s3 = subprocess.run([sys.executable, "-c", code], env={**base, "RECLAIMNET_RESULTS_S3_BUCKET": "results"},
                        capture_output=True, text=True, timeout=60)
    assert s3.stdout.strip() == "storages.backends.s3.S3Storage", s3.stderr[-500:]
