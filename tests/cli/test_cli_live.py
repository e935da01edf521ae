"""The ``reclaimnet`` command line against a live portal (a real HTTP server on the test database) (design §13):
login and its token file, logout revoking the token, submit from a spec, list, status, following a running job's
output, cancel, the provider commands, and the exit codes. Commands run in this process (``Terminal.run``); the
installed console script runs in a subprocess where only a real process shows it (``Terminal.run_script``,
``Terminal.popen``): the login that writes the 0600 file, exit statuses 1 and 2 as the shell sees them, and
``logs -f`` following a job."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from rest_framework.authtoken.models import Token

from portal.control.link import output
from portal.control.reclaim.plan import preview
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Job, Node, ReclaimEvent, ResultKind
from portal.core.services import results
from reclaimnet.cli import build_parser
from tests.cli.conftest import LiveCampus, Terminal
from tests.portal import factories as f

SPEC = """\
# A job spec: the fields of POST /api/jobs/ (durations and sizes may carry units)
name: bert-finetune
group: NLP Group
command: python train.py --epochs 3
gpu_count: 1
vram_gb_per_gpu: 16
expected_runtime_s: 2h
ckpt_bytes_estimate: 3.2GB
loss_budget_s: 10m
"""


def _spec(tmp_path: Path, text: str = SPEC, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_login_keeps_the_token_in_a_file_only_its_owner_reads(campus: LiveCampus) -> None:
    shell: Terminal = campus.terminal(None)
    wrong = shell.login("researcher", "not-the-password")
    assert wrong.returncode == 1
    assert "Login refused: Unable to log in with provided credentials." in wrong.stderr
    assert not (shell.config_home / "reclaimnet" / "config.json").exists()
    done = shell.run_script("login", "--username", "researcher", "--password-stdin", input=f.PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    assert "Logged in to" in done.stdout and "as researcher (researcher)" in done.stdout
    path = shell.config_home / "reclaimnet" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    stored = json.loads(path.read_text())
    assert stored["token"] == Token.objects.get(user=campus.labs.users["researcher"]).key
    assert stored["url"] == shell.url and stored["username"] == "researcher"


def test_logout_revokes_the_token_on_the_portal_and_removes_it_here(campus: LiveCampus) -> None:
    user = f.make_user(f"leaver-{f.uid()}", password=f.PASSWORD)
    shell: Terminal = campus.terminal(None)
    assert shell.login(user.username).returncode == 0
    path = shell.config_home / "reclaimnet" / "config.json"
    old = json.loads(path.read_text())["token"]
    assert shell.run("jobs").returncode == 0

    done = shell.run("logout")
    assert done.returncode == 0, done.stderr
    assert "the portal revoked the token" in done.stdout
    assert "token" not in json.loads(path.read_text())
    assert not Token.objects.filter(key=old).exists()
    with_old = shell.run("jobs", "--json")
    assert with_old.returncode == 1 and "Not logged in" in with_old.stderr
    request = urllib.request.Request(f"{campus.url}/api/jobs/", headers={"Authorization": f"Token {old}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401

    assert shell.login(user.username).returncode == 0
    new = json.loads(path.read_text())["token"]
    assert new != old and Token.objects.get(user=user).key == new
    assert shell.run("logout").returncode == 0 and shell.run("logout").stdout.strip() == "Not logged in."


def test_logout_with_the_portal_unreachable_removes_the_token_here_and_exits_1(campus: LiveCampus) -> None:
    user = f.make_user(f"leaver-{f.uid()}", password=f.PASSWORD)
    shell: Terminal = campus.terminal(None)
    assert shell.login(user.username).returncode == 0
    path = shell.config_home / "reclaimnet" / "config.json"
    with socket.socket() as closed:  # a loopback port with nothing listening
        closed.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{closed.getsockname()[1]}"
    stored = {**json.loads(path.read_text()), "url": unreachable}
    path.write_text(json.dumps(stored))
    run = shell.run("logout")
    assert run.returncode == 1
    assert "unreachable" in run.stderr and "the portal did not revoke it" in run.stderr
    assert json.loads(path.read_text()) == {"url": unreachable, "username": user.username}
    assert Token.objects.filter(key=stored["token"]).exists()  # still valid there, as it said


def test_not_logged_in_is_refused_with_exit_1(campus: LiveCampus) -> None:
    run = campus.terminal(None).run_script("jobs")
    assert run.returncode == 1 and "Not logged in" in run.stderr and "reclaimnet login" in run.stderr


def test_submit_from_a_yaml_spec_then_list_status_and_cancel(campus: LiveCampus,
                                                             tmp_path: Path) -> None:
    shell: Terminal = campus.terminal("researcher")
    submitted = shell.run("submit", _spec(tmp_path))
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(name="bert-finetune")
    assert f"Submitted job {job.pk} (bert-finetune): queued." in submitted.stdout
    assert job.group == campus.labs.group and job.expected_runtime_s == 7200.0
    assert job.ckpt_bytes_estimate == 3_200_000_000 and job.loss_budget_s == 600.0

    table = shell.run("jobs").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "STATE", "GPUS", "NODE"]
    assert [str(job.pk), "bert-finetune", "queued", "1", "-", "NLP", "Group", "researcher"] in [
        line.split()[:8] for line in table[1:]]
    listed = json.loads(shell.run("jobs", "--json", "--state", "queued").stdout)
    assert job.pk in [row["id"] for row in listed] and {row["state"] for row in listed} == {"queued"}
    bogus = shell.run("jobs", "--state", "bogus")
    assert bogus.returncode == 1 and "state: " in bogus.stderr
    detail = json.loads(shell.run("status", str(job.pk), "--json").stdout)
    assert detail["state"] == "queued" and "waiting_reason" in detail
    status = shell.run("status", str(job.pk))
    assert status.returncode == 0 and "state: queued" in status.stdout

    cancelled = shell.run("cancel", str(job.pk))
    assert cancelled.returncode == 0 and f"Job {job.pk} (bert-finetune): cancelled." in cancelled.stdout
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    again = shell.run("cancel", str(job.pk))
    assert again.returncode == 1 and "cancel" in again.stderr


def test_a_bad_spec_is_refused_naming_the_field_with_exit_1(campus: LiveCampus,
                                                            tmp_path: Path) -> None:
    shell: Terminal = campus.terminal("researcher")
    spec = SPEC.replace("bert-finetune", "refused-job")
    bad = shell.run("submit", _spec(tmp_path, spec.replace("gpu_count: 1", "gpu_count: 17")))
    assert bad.returncode == 1
    assert "gpu_count: Ensure this value is less than or equal to 16." in bad.stderr
    as_json = shell.run("submit", "--json", _spec(tmp_path, spec.replace("command: python", "command: ''\n#")))
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"]["fields"] == {"command": ["Give a command or a container image."]}
    unknown_group = shell.run("submit", _spec(tmp_path, spec.replace("NLP Group", "Bio Group")))
    assert unknown_group.returncode == 1 and "group:" in unknown_group.stderr
    assert not Job.objects.filter(name="refused-job").exists()


@pytest.mark.parametrize(("text", "said"), [
    ("name: unreadable-job\ngpu_count: [unclosed\n", "not valid YAML or JSON (line 3"),
    ("- name: unreadable-job\n- of things\n", "a spec is a mapping of job fields"),
])
def test_a_spec_that_cannot_be_read_is_a_usage_error_with_exit_2(campus: LiveCampus,
                                                                 tmp_path: Path, text: str, said: str) -> None:
    run = campus.terminal("researcher").run("submit", _spec(tmp_path, text))
    assert run.returncode == 2 and said in run.stderr
    assert not Job.objects.filter(name="unreadable-job").exists()


def test_usage_errors_exit_2(campus: LiveCampus, tmp_path: Path) -> None:
    shell: Terminal = campus.terminal(None)
    assert shell.run("status", "not-a-number").returncode == 2
    assert shell.run("reclaim", "vision-01", "--notice", "60", "--emergency").returncode == 2
    assert shell.run_script("frobnicate").returncode == 2
    missing = shell.run("submit", str(tmp_path / "nowhere.yaml"))
    assert missing.returncode == 2 and "cannot read it" in missing.stderr


def test_a_spec_on_stdin_with_an_idempotency_key_makes_one_job(campus: LiveCampus) -> None:
    shell: Terminal = campus.terminal("researcher")
    spec = json.dumps({"name": "once", "command": "python train.py", "gpu_count": 1, "expected_runtime_s": 600,
                       "ckpt_bytes_estimate": 10**9})
    first = shell.run("submit", "-", "--json", "--idempotency-key", "nightly-1", input=spec)
    second = shell.run("submit", "-", "--json", "--idempotency-key", "nightly-1", input=spec)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["id"] == json.loads(second.stdout)["id"]
    assert Job.objects.filter(name="once").count() == 1


def test_submit_with_memory_and_cpus_reaches_the_job_and_the_portal_names_a_bad_spec_field(
        campus: LiveCampus, tmp_path: Path) -> None:
    """design §19.2: the options become the job's cgroup limits; a spec's out-of-range value is the portal's 400."""
    shell: Terminal = campus.terminal("researcher")
    spec = SPEC.replace("bert-finetune", "limited-job")
    made = shell.run("submit", _spec(tmp_path, spec), "--memory", "16G", "--cpus", "2.5", "--json")
    assert made.returncode == 0, made.stderr
    assert (json.loads(made.stdout)["memory_bytes"], json.loads(made.stdout)["cpu_cores"]) == (16 * 2**30, 2.5)
    job = Job.objects.get(name="limited-job")
    assert (job.memory_bytes, job.cpu_cores) == (16 * 2**30, 2.5)
    status = shell.run("status", str(job.pk))
    assert f"memory_bytes: {16 * 2**30}" in status.stdout and "cpu_cores: 2.5" in status.stdout
    refused = shell.run("submit", _spec(tmp_path, spec.replace("limited-job", "tiny-job") + "memory_bytes: 100M\n"))
    assert refused.returncode == 1 and "memory_bytes:" in refused.stderr
    assert not Job.objects.filter(name="tiny-job").exists()


def _write(campus: LiveCampus, job: Job, text: str) -> None:
    """What the agent link does with a job_output report from the job's node."""
    with transaction.atomic():
        assert output.append_report(campus.labs.node.pk, {"job_id": job.pk, "text": text}) is None


def _lines(stream: Any) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def _read_until(lines: queue.Queue[str], wanted: str, timeout_s: float = 15) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            break
        if wanted in seen[-1]:
            return seen
    raise AssertionError(f"{wanted!r} never came; got {seen!r}")


def test_logs_follow_prints_output_as_it_appears_until_the_job_ends(campus: LiveCampus) -> None:
    job = f.make_job(campus.labs.group, campus.labs.users["researcher"], name="follow-me")
    f.place_job(job, campus.labs.node)
    with transaction.atomic():
        output.begin_run(job.pk, campus.labs.node.pk, restored_sequence=None, restored_step=None)
    _write(campus, job, "epoch 1 loss 0.91\n")
    follower = campus.terminal("researcher").popen("logs", str(job.pk), "-f", "--poll", "0.1")
    try:
        lines = _lines(follower.stdout)
        first = _read_until(lines, "epoch 1 loss 0.91")
        assert first[0].startswith("— run 1 on node vision-01")
        _write(campus, job, "epoch 2 loss λ=0.5\n")
        _read_until(lines, "epoch 2 loss λ=0.5")
        _write(campus, job, "saved model\n")
        with transaction.atomic():
            job_lifecycle.complete(Job.objects.select_for_update().get(pk=job.pk))
        _read_until(lines, "saved model")
        assert follower.wait(timeout=15) == 0
        assert f"job {job.pk} completed" in (follower.stderr.read() if follower.stderr else "")
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_logs_prints_the_kept_output_and_json_parses(campus: LiveCampus) -> None:
    job = f.make_job(campus.labs.group, campus.labs.users["researcher"])
    f.place_job(job, campus.labs.node)
    _write(campus, job, "step 1\nstep 2\n")
    shell: Terminal = campus.terminal("researcher")
    plain = shell.run("logs", str(job.pk))
    assert plain.returncode == 0 and plain.stdout == "step 1\nstep 2\n"
    answer = json.loads(shell.run("logs", str(job.pk), "--json").stdout)
    assert answer["text"] == "step 1\nstep 2\n" and answer["running"] is True and answer["next_offset"] == 14


def test_another_groups_job_is_not_found_with_exit_1(campus: LiveCampus) -> None:
    theirs = f.make_job(campus.labs.other_group, campus.labs.users["other_researcher"])
    shell: Terminal = campus.terminal("researcher")
    for command in ("status", "logs", "cancel"):
        run = shell.run(command, str(theirs.pk))
        assert run.returncode == 1 and "reclaimnet: not found (404)" in run.stderr, (command, run.stderr)
    assert Job.objects.get(pk=theirs.pk).state == "queued"


def _lab_node(campus: LiveCampus) -> Node:
    node, _ = f.make_node(campus.labs.lab, campus.labs.building, state="online")
    return node


def test_a_provider_lists_reclaims_and_lends_their_node(campus: LiveCampus) -> None:
    node = _lab_node(campus)
    shell: Terminal = campus.terminal("provider")
    table = shell.run("nodes")
    assert table.returncode == 0 and node.name in table.stdout and "robotics-01" not in table.stdout
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "NAME", "LAB", "STATE"]
    mine = {n["name"] for n in json.loads(shell.run("nodes", "--json").stdout)}
    assert {"vision-01", node.name} <= mine and "robotics-01" not in mine
    everyone = {n["name"] for n in json.loads(shell.run("nodes", "--all", "--json").stdout)}
    assert {"vision-01", "robotics-01", node.name} <= everyone

    reclaimed = shell.run("reclaim", node.name, "--emergency")
    assert reclaimed.returncode == 0, reclaimed.stderr
    assert f"of node {node.name}: emergency" in reclaimed.stdout
    assert Node.objects.get(pk=node.pk).state == "reclaimed"
    lent = shell.run("lend", str(node.pk), "--json")
    assert lent.returncode == 0 and json.loads(lent.stdout)["state"] == "offline"
    assert Node.objects.get(pk=node.pk).state == "offline"

    theirs = shell.run("reclaim", "robotics-01", "--notice", "10m")
    assert theirs.returncode == 1 and "provider lab" in theirs.stderr
    assert Node.objects.get(pk=campus.labs.other_node.pk).state == "online"
    assert shell.run("reclaim", "no-such-node", "--emergency").returncode == 1


def test_a_scheduled_reclaim_takes_the_notice_as_a_duration(campus: LiveCampus) -> None:
    node = _lab_node(campus)
    run = campus.terminal("provider").run("reclaim", node.name, "--notice", "10m", "--json")
    assert run.returncode == 0, run.stderr
    event = json.loads(run.stdout)
    assert event["kind"] == "scheduled" and event["notice_s"] == 600.0
    assert ReclaimEvent.objects.get(pk=event["id"]).node_id == node.pk
    assert Node.objects.get(pk=node.pk).state == "draining"


def test_a_reclaim_without_a_notice_takes_the_shortest_loss_free_one(campus: LiveCampus) -> None:
    node = _lab_node(campus)
    shortest = preview(node, 0.0)["shortest_loss_free_notice_s"]
    run = campus.terminal("provider").run("reclaim", str(node.pk), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["notice_s"] == shortest


def test_a_researcher_is_refused_the_provider_commands(campus: LiveCampus) -> None:
    shell: Terminal = campus.terminal("researcher")
    nodes = shell.run("nodes")
    assert nodes.returncode == 1 and "not a member of a provider lab" in nodes.stderr
    reclaim = shell.run("reclaim", "vision-01", "--notice", "60")
    assert reclaim.returncode == 1 and "provider lab" in reclaim.stderr
    emergency = shell.run("reclaim", "vision-01", "--emergency", "--json")
    assert emergency.returncode == 1 and json.loads(emergency.stdout)["error"]["status"] == 403
    lend = shell.run("lend", "vision-01")
    assert lend.returncode == 1
    node = Node.objects.get(pk=campus.labs.node.pk)
    assert node.state == "online" and not ReclaimEvent.objects.filter(node=node).exists()


def test_help_documents_every_command(campus: LiveCampus) -> None:
    top = campus.terminal(None).run("--help")
    assert top.returncode == 0 and "Exit status: 0 done, 1 refused" in top.stdout
    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    for command in ("login", "submit", "jobs", "status", "logs", "cancel", "results", "fetch", "nodes",
                    "reclaim", "lend"):
        assert command in top.stdout
        text = commands[command].format_help()
        assert "--json" in text and len(commands[command].description or "") > 10, command


def _upload(campus: LiveCampus, job: Job, kind: str, path: str, data: bytes) -> None:
    """What the job's agent does when it ends (design §14): one file in one chunk, checked by the portal."""
    answer = results.receive_chunk(campus.labs.node.pk, job.pk, kind, path, sha256=hashlib.sha256(data).hexdigest(),
                                   total_size=len(data), offset=0, data=data,
                                   checkpoint_sequence=1 if kind == ResultKind.CHECKPOINT else None)
    assert answer.status == 201, answer.body


def test_fetch_downloads_the_results_and_the_checkpoint_byte_identical(campus: LiveCampus, tmp_path: Path) -> None:
    job = f.make_job(campus.labs.group, campus.labs.users["researcher"], name="with-results", output_dir="out")
    f.place_job(job, campus.labs.node)
    files = {"metrics.json": b'{"loss": 0.41}\n', "plots/loss curve #1.png": os.urandom(70_000),
             "model/weights.bin": os.urandom(1_500_017)}
    for path, data in files.items():
        _upload(campus, job, ResultKind.OUTPUT, path, data)
    assert results.complete(campus.labs.node.pk, job.pk, files=list(files), checkpoint=None).status == 200
    checkpoint = os.urandom(250_000)
    _upload(campus, job, ResultKind.CHECKPOINT, "final.pt", checkpoint)

    shell: Terminal = campus.terminal("researcher")
    listing = json.loads(shell.run("results", str(job.pk), "--json").stdout)
    assert listing["state"] == "complete" and listing["total_bytes"] == sum(map(len, files.values()))
    assert sorted(item["path"] for item in listing["files"]) == sorted(files)
    table = shell.run("results", str(job.pk))
    assert "3 files" in table.stdout and "results complete" in table.stdout

    fetched = shell.run("fetch", str(job.pk), "-o", str(tmp_path / "out"))
    assert fetched.returncode == 0, fetched.stderr
    assert "3 files" in fetched.stdout and "every SHA-256 checked" in fetched.stdout
    for path, data in files.items():
        assert (tmp_path / "out" / path).read_bytes() == data, path
    again = shell.run("fetch", str(job.pk), "-o", str(tmp_path / "out"), "--json")
    assert {item["outcome"] for item in json.loads(again.stdout)["files"]} == {"unchanged"}

    got = shell.run("fetch", str(job.pk), "--checkpoint", "-o", str(tmp_path / "ck"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "ck" / f"job-{job.pk}-checkpoint").read_bytes() == checkpoint

    stranger = campus.terminal("other_researcher").run("fetch", str(job.pk), "-o", str(tmp_path / "theirs"))
    assert stranger.returncode == 1 and "not found (404)" in stranger.stderr
    assert not (tmp_path / "theirs").exists() or not any((tmp_path / "theirs").iterdir())


def test_fetch_of_a_job_without_results_says_so(campus: LiveCampus, tmp_path: Path) -> None:
    job = f.make_job(campus.labs.group, campus.labs.users["researcher"], name="no-results")
    shell: Terminal = campus.terminal("researcher")
    run = shell.run("fetch", str(job.pk), "-o", str(tmp_path / "none"))
    assert run.returncode == 0 and "no results yet (results none)" in run.stdout
    checkpoint = shell.run("fetch", str(job.pk), "--checkpoint", "-o", str(tmp_path / "none"))
    assert checkpoint.returncode == 1 and "No final checkpoint" in checkpoint.stderr


def test_an_array_submit_with_a_dependency_passes_through_and_prints_its_jobs(campus: LiveCampus,
                                                                              tmp_path: Path) -> None:
    shell: Terminal = campus.terminal("researcher")
    first = json.loads(shell.run("submit", "--json", _spec(tmp_path, SPEC.replace("bert-finetune", "prep"))).stdout)
    sweep = SPEC.replace("bert-finetune", "sweep") + f"array: 0-3%2\nafter_ok: [{first['id']}]\n"
    run = shell.run("submit", _spec(tmp_path, sweep))
    assert run.returncode == 0, run.stderr
    tasks = list(Job.objects.filter(array_task__array__name="sweep").order_by("array_task__index").values_list("id", flat=True))
    assert len(tasks) == 4 and f": 4 jobs {tasks[0]}–{tasks[-1]}." in run.stdout and "0-3%2" in run.stdout
    detail = json.loads(shell.run("status", str(tasks[0]), "--json").stdout)
    assert detail["after_ok"] == [first["id"]] and detail["array"]["index"] == 0
    bad = shell.run("submit", _spec(tmp_path, SPEC + "after_ok: [999999]\n"))
    assert bad.returncode == 1 and "after_ok:" in bad.stderr


def test_the_example_spec_is_accepted(campus: LiveCampus) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
    run = campus.terminal("researcher").run("submit", str(example), "--json")
    assert run.returncode == 0, run.stderr
    job = Job.objects.get(pk=json.loads(run.stdout)["id"])
    assert (job.name, job.expected_runtime_s, job.ckpt_bytes_estimate, job.output_dir) == (
        "bert-finetune", 7200.0, 3_200_000_000, "out")
