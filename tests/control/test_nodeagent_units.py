"""Agent-side units without a portal: job helper library, data plane, configuration (design §1, §2, §4)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nodeagent import jobkit
from nodeagent.config import ConfigError, build_config, normalise_portal_url
from nodeagent.edge import Edge, TokenBucket, mark_socket
from nodeagent.runner import prepare_restore, resolve_command
from nodeagent.transfer import Expected, Faults, Receiver, send_checkpoint, store_dir, token_hash

pytestmark = pytest.mark.timeout(30)


def _ck(tmp_path: Path, **kw: Any) -> jobkit.Checkpointer:
    return jobkit.Checkpointer(tmp_path / "ck", install_signals=False, **kw)


def test_checkpoint_roundtrip_manifest_and_atomicity(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    state = {"w": np.arange(5.0), "b": np.ones(1)}
    m = ck.checkpoint(7, state)
    assert m.sequence == 1 and m.step == 7 and m.size_bytes == (ck.ckpt_dir / m.file).stat().st_size
    assert m.sha256 == jobkit.sha256_file(ck.ckpt_dir / m.file)
    assert m.compat["framework"] in ("numpy", "torch")
    assert not [p for p in ck.ckpt_dir.iterdir() if ".tmp-" in p.name]
    step, restored = _ck(tmp_path).restore()
    assert step == 7 and np.array_equal(restored["w"], state["w"])


def test_corrupt_newest_checkpoint_is_never_restored(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    ck.checkpoint(1, {"w": np.zeros(3)})
    newest = ck.checkpoint(2, {"w": np.ones(3)})
    data = ck.ckpt_dir / newest.file
    data.write_bytes(b"\x00" + data.read_bytes()[1:])
    step, state = _ck(tmp_path).restore()
    assert step == 1 and not state["w"].any()
    assert _ck(tmp_path, restore_sequence=2).restore() is None  # pinned to a corrupt one: start fresh


def test_requests_interval_and_pruning(tmp_path: Path) -> None:
    now = [0.0]
    control = tmp_path / "control.json"
    ck = _ck(tmp_path, interval_s=10.0, keep_last=2, control_file=control, clock=lambda: now[0])
    assert not ck.due()
    ck.request()
    assert ck.due() and not ck.maybe_checkpoint(1, lambda: {"w": np.zeros(1)})
    now[0] = 11.0
    assert ck.due()
    ck.maybe_checkpoint(2, lambda: {"w": np.zeros(1)})
    jobkit.atomic_write_bytes(control, json.dumps({"interval_s": 1.0}).encode())
    now[0] = 12.5
    assert ck.due() and ck.interval_s == 1.0  # P1's new interval picked up from the control file
    ck.request(final=True)
    assert ck.maybe_checkpoint(3, lambda: {"w": np.zeros(1)}) is True
    assert [m.sequence for m in jobkit.list_manifests(ck.ckpt_dir)] == [2, 3]
    assert jobkit.list_manifests(ck.ckpt_dir)[-1].final


def test_next_sequence_and_restore_pruning(tmp_path: Path) -> None:
    ck = _ck(tmp_path, next_sequence=5)
    assert ck.checkpoint(1, {"w": np.zeros(1)}).sequence == 5
    ck.checkpoint(2, {"w": np.zeros(1)})
    prepare_restore(ck.ckpt_dir, 5)  # a diverged newer checkpoint is dropped before resuming from 5
    assert [m.sequence for m in jobkit.list_manifests(ck.ckpt_dir)] == [5]


def _write_ckpt(tmp_path: Path, job: str, seq: int, size: int) -> tuple[Path, dict[str, Any]]:
    ck = jobkit.Checkpointer(store_dir(tmp_path / "src", job), job_id=job, next_sequence=seq, install_signals=False)
    m = ck.checkpoint(1, {"pad": np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)})
    return ck.ckpt_dir / m.file, json.loads(m.to_json())


async def _transfer(tmp_path: Path, *, token: str = "tok", faults: dict[str, int] | None = None,
                    rate: float | None = None, size: int = 300_000) -> tuple[Any, list[str], Path]:
    path, manifest = _write_ckpt(tmp_path, "9", 4, size)
    received: list[str] = []

    async def on_received(tid: str, m: dict[str, Any]) -> None:
        received.append(tid)

    rx = Receiver(tmp_path / "dst", on_received)
    host, port = await rx.start("127.0.0.1", 0)
    rx.expect(Expected("t1", token_hash("tok"), "9", 4, manifest["sha256"], manifest["size_bytes"], time.time() + 60))
    fault_file = tmp_path / "faults.json"
    if faults:
        fault_file.write_text(json.dumps(faults))
    try:
        result = await send_checkpoint(host=host, port=port, transfer_id="t1", token=token, ckpt_path=path,
                                       manifest=manifest, rate_bytes_per_s=rate, flow_class="migration",
                                       edge=Edge(None, "off"), faults=Faults(fault_file), backoff_s=0.01)
    finally:
        await rx.close()
    return result, received, store_dir(tmp_path / "dst", "9")


@pytest.mark.asyncio
async def test_transfer_verifies_and_publishes(tmp_path: Path) -> None:
    result, received, dest = await _transfer(tmp_path)
    assert result.ok and result.attempts == 1 and received == ["t1"]
    (m,) = jobkit.list_manifests(dest)
    assert m.sequence == 4 and jobkit.verify(dest, m)


@pytest.mark.asyncio
async def test_transfer_with_wrong_token_is_refused(tmp_path: Path) -> None:
    result, received, dest = await _transfer(tmp_path, token="nope")
    assert not result.ok and result.attempts == 1 and "bad token" in result.errors[0]
    assert not received and not jobkit.list_manifests(dest)


@pytest.mark.asyncio
async def test_corrupt_copy_is_discarded_and_resent(tmp_path: Path) -> None:
    result, received, dest = await _transfer(tmp_path, faults={"corrupt": 1})
    assert result.ok and result.attempts == 2 and "sha256 mismatch" in result.errors[0]
    assert received == ["t1"] and jobkit.verify(dest, jobkit.list_manifests(dest)[0])
    assert not list((tmp_path / "dst" / "incoming").iterdir())


@pytest.mark.asyncio
async def test_truncated_copy_resumes_from_offset(tmp_path: Path) -> None:
    size = 400_000
    result, _, dest = await _transfer(tmp_path, faults={"truncate": 1}, size=size)
    assert result.ok and result.attempts == 2
    assert result.bytes_sent < 1.2 * size  # the second attempt sent only the missing part
    assert jobkit.verify(dest, jobkit.list_manifests(dest)[0])


@pytest.mark.asyncio
async def test_transfer_is_paced_at_the_assigned_rate(tmp_path: Path) -> None:
    size = 600_000
    result, _, _ = await _transfer(tmp_path, rate=1_000_000, size=size)
    # 128 KiB burst, then 1 MB/s: at least (size - burst) / rate seconds.
    assert result.ok and result.elapsed_s >= (size - 128 * 1024) / 1_000_000 * 0.9


@pytest.mark.asyncio
async def test_token_bucket_unpaced_without_rate() -> None:
    start = time.monotonic()
    bucket = TokenBucket(None)
    for _ in range(100):
        await bucket.consume(1 << 20)
    assert time.monotonic() - start < 0.1


def test_dscp_marking_sets_ip_tos() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        mark_socket(s, 34)
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 34 << 2


def test_config_validation_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECLAIMNET_AGENT_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="token"):
        build_config({}, {"portal": "ws://x/"})
    with pytest.raises(ConfigError, match="portal"):
        build_config({"token": "t"}, {})
    with pytest.raises(ConfigError, match="simulate_gpus"):
        build_config({"token": "t", "portal": "ws://x", "simulate_gpus": [{"vram": 3}]}, {})
    with pytest.raises(ConfigError, match="unknown configuration keys: colour"):
        build_config({"token": "t", "portal": "ws://x", "colour": 1}, {})
    (tmp_path / "tok").write_text("secret\n")
    cfg = build_config({"portal": "http://h:8000", "token_file": str(tmp_path / "tok"), "simulate_gpus": 2}, {})
    assert cfg.token == "secret" and cfg.portal == "ws://h:8000/ws/agent/" and len(cfg.simulate_gpus) == 2
    assert normalise_portal_url("https://h/ws/agent/") == "wss://h/ws/agent/"


def test_cli_reports_config_errors(tmp_path: Path) -> None:
    import subprocess

    bad = tmp_path / "agent.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "nodeagent", "--config", str(bad)], capture_output=True, text=True,
                         env={**os.environ, "RECLAIMNET_AGENT_TOKEN": ""}, timeout=20)
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_resolve_command_uses_this_python_and_base_dir(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    argv = resolve_command("python train.py --steps 3", tmp_path)
    assert argv[0] == sys.executable and argv[1] == str((tmp_path / "train.py").resolve()) and argv[2:] == [
        "--steps", "3"]


def test_example_trainer_resumes_bitwise(tmp_path: Path) -> None:
    """The example job: a run interrupted by a final checkpoint resumes to the same weights."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"
    ref = subprocess.run([sys.executable, str(script), "--steps", "40", "--result", str(tmp_path / "ref.json")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert ref.returncode == 0
    env = {**os.environ, "RECLAIMNET_CKPT_DIR": str(tmp_path / "ck"), "RECLAIMNET_CKPT_INTERVAL_S": "0"}
    proc = subprocess.Popen([sys.executable, str(script), "--steps", "40", "--step-sleep", "0.05", "--result",
                             str(tmp_path / "r.json")], env=env, cwd=tmp_path)
    # Signal only once the trainer has checkpointed (its handlers are installed by then): a fixed sleep could
    # deliver SIGUSR2 to a still-starting interpreter on a loaded machine, whose default action is to die.
    deadline = time.monotonic() + 20
    while not jobkit.list_manifests(tmp_path / "ck") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(__import__("signal").SIGUSR2)
    assert proc.wait(20) == jobkit.EXIT_CHECKPOINTED
    done = subprocess.run([sys.executable, str(script), "--steps", "40", "--result", str(tmp_path / "r.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert "restored step" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads((tmp_path / "ref.json").read_text())


def test_manifest_naming_another_file_is_never_used(tmp_path: Path) -> None:
    """A manifest (written by a job, or tampered with) cannot point the agent outside its checkpoint dir."""
    ck = _ck(tmp_path)
    ck.checkpoint(3, {"w": np.arange(4.0)})
    secret = tmp_path / "secret.txt"
    secret.write_text("node token")
    (good,) = jobkit.list_manifests(ck.ckpt_dir)
    evil = json.loads(good.to_json()) | {"sequence": 2, "file": "../secret.txt", "size_bytes": secret.stat().st_size,
                                         "sha256": jobkit.sha256_file(secret)}
    (ck.ckpt_dir / f"{jobkit.ckpt_stem(2)}{jobkit.MANIFEST_SUFFIX}").write_text(json.dumps(evil))
    assert [m.sequence for m in jobkit.list_manifests(ck.ckpt_dir)] == [good.sequence]
    # A data file that is a symlink to elsewhere never verifies.
    data = ck.ckpt_dir / good.file
    data.unlink()
    data.symlink_to(secret)
    assert not jobkit.verify(ck.ckpt_dir, good)


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "..", "/etc", "x" * 65])
def test_ids_from_the_network_are_single_safe_path_components(tmp_path: Path, bad: str) -> None:
    async def nop(*_: Any) -> None:
        return None

    rx = Receiver(tmp_path, nop)
    with pytest.raises(ValueError, match="unsafe"):
        rx.expect(Expected(bad, token_hash("t"), "9", 1, "a" * 64, 10, time.time() + 60))
    with pytest.raises(ValueError, match="unsafe"):
        rx.expect(Expected("t1", token_hash("t"), bad, 1, "a" * 64, 10, time.time() + 60))
    with pytest.raises(ValueError, match="unsafe"):
        store_dir(tmp_path, bad)
    assert not rx.expected


def test_job_environment_does_not_carry_the_agent_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent.runner import start_job

    monkeypatch.setenv("RECLAIMNET_AGENT_TOKEN", "rna_secret")
    script = tmp_path / "env.py"
    script.write_text("import os, pathlib\npathlib.Path('env.json').write_text(repr(dict(os.environ)))\n")
    run = start_job(data_dir=tmp_path / "data", base_dir=tmp_path, job_id="5", command=f"python {script}", gpus=[0],
                    interval_s=None, next_sequence=1, restore_sequence=None, compat={}, kill_with_agent=False)
    assert run.proc.wait(timeout=20) == 0
    env = (run.work_dir / "env.json").read_text()
    assert "rna_secret" not in env and "RECLAIMNET_CKPT_DIR" in env


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"heartbeat_interval_s": "nan"}, "heartbeat_interval_s"),
        ({"heartbeat_interval_s": float("inf")}, "heartbeat_interval_s"),
        ({"reconnect_min_s": 5, "reconnect_max_s": 1}, "reconnect_min_s"),
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"data_port": 80.5}, "data_port"),
        ({"data_host": 7}, "data_host"),
        ({"link_capacity_bytes_per_s": "inf"}, "link_capacity_bytes_per_s"),
    ],
)
def test_config_rejects_values_that_would_stall_the_agent(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_config({"token": "t", "portal": "ws://x", **values}, {})


def test_job_written_progress_and_result_cannot_break_the_agent(tmp_path: Path) -> None:
    """progress.json / result.json are the job's: garbage reads as 0 / {}, never raises (it would stop the
    heartbeat loop), and values stay within what the portal accepts."""
    from nodeagent.runner import MAX_STEP, RunningJob

    run = RunningJob(job_id="1", gpus=[], proc=None, work_dir=tmp_path, ckpt_dir=tmp_path)  # type: ignore[arg-type]
    for text, step in (("[1]", 0), ('{"step": "x"}', 0), ('{"step": 1e400}', 0), (json.dumps({"step": 2**80}),
                                                                                      MAX_STEP)):
        run.progress_file.write_text(text)
        assert run.step() == step
    run.result_file.write_text("[1, 2]")
    assert run.result() == {}
    run.result_file.write_text(json.dumps({"pad": "x" * 20_000}))
    assert run.result() == {}
    run.result_file.write_text(json.dumps({"weights_sha256": "ab"}))
    assert run.result() == {"weights_sha256": "ab"}


@pytest.mark.asyncio
async def test_second_connection_for_a_transfer_in_progress_is_refused(tmp_path: Path) -> None:
    """Two writers appending to one partial file would interleave bytes: one connection per transfer."""
    import asyncio

    async def nop(*_: Any) -> None:
        return None

    rx = Receiver(tmp_path, nop)
    host, port = await rx.start("127.0.0.1", 0)
    rx.expect(Expected("t1", token_hash("tok"), "9", 1, "a" * 64, 1000, time.time() + 60))
    header = json.dumps({"transfer_id": "t1", "token": "tok", "manifest": {"sha256": "a" * 64,
                                                                           "size_bytes": 1000}}).encode() + b"\n"
    try:
        r1, w1 = await asyncio.open_connection(host, port)
        w1.write(header)
        assert json.loads(await r1.readline()) == {"ok": True, "offset": 0}
        w1.write(b"x" * 100)  # ... and the first sender stalls mid-copy
        await w1.drain()
        r2, w2 = await asyncio.open_connection(host, port)
        w2.write(header)
        assert json.loads(await r2.readline()) == {"ok": False, "error": "transfer already in progress"}
        w1.close()
        w2.close()
        await asyncio.sleep(0)
    finally:
        await rx.close()


# --- the reliable link, agent side (design §9.9) ---------------------------------------------------------------
class _Socket:
    """Stands in for the agent's websocket: keeps what the agent sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("type") == kind]


def _agent(tmp_path: Path) -> Any:
    from nodeagent.agent import Agent

    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off"}, {})
    agent = Agent(cfg)
    agent.ws = _Socket()
    return agent


@pytest.mark.asyncio
async def test_a_command_received_twice_is_acked_twice_and_executed_once(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ran: list[dict[str, Any]] = []

    async def stop(msg: dict[str, Any]) -> None:
        ran.append(msg)

    agent._cmd_stop_job = stop
    cmd = json.dumps({"type": "stop_job", "cmd_id": "c1", "job_id": 4, "reason": "x"})
    await agent._on_message(cmd)
    await agent.flush_acks()
    await agent._on_message(cmd)
    await agent.flush_acks()
    assert len(ran) == 1
    assert [m["cmd_ids"] for m in agent.ws.of("ack")] == [["c1"], ["c1"]]  # acked again, not run again
    assert not agent.pending  # acks are not kept for re-sending


@pytest.mark.asyncio
async def test_an_older_command_of_a_subject_arriving_late_is_not_executed(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ran: list[float] = []

    async def interval(msg: dict[str, Any]) -> None:
        ran.append(msg["interval_s"])

    agent._cmd_set_interval = interval
    for cmd_id, issued, value in (("new", 200, 20.0), ("old", 100, 10.0)):
        await agent._on_message(json.dumps({"type": "set_interval", "cmd_id": cmd_id, "job_id": 1,
                                            "interval_s": value, "supersede_key": "set_interval:1",
                                            "issued_us": issued}))
    await agent.flush_acks()
    assert ran == [20.0] and agent.ws.of("ack")[0]["cmd_ids"] == ["new", "old"]  # both acked, in one message


@pytest.mark.asyncio
async def test_the_command_memory_is_bounded(tmp_path: Path) -> None:
    from nodeagent.agent import SEEN_COMMANDS

    agent = _agent(tmp_path)
    for k in range(SEEN_COMMANDS + 10):
        await agent._on_message(json.dumps({"type": "set_interval", "cmd_id": f"c{k}", "job_id": 1}))
    assert len(agent.seen_commands) == SEEN_COMMANDS and "c0" not in agent.seen_commands


@pytest.mark.asyncio
async def test_a_report_is_kept_until_the_portal_answers_and_is_resent_in_order(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.ws = None  # disconnected: kept
    await agent.send({"type": "job_started", "job_id": 1, "restored_sequence": None})
    await agent.send({"type": "job_exited", "job_id": 1, "returncode": 0, "step": 3, "result": {}, "reason": "x"})
    await agent.send({"type": "heartbeat", "seq": 1}, reliable=False)  # heartbeats are not kept
    assert [m["type"] for m, *_ in agent.pending.values()] == ["job_started", "job_exited"]
    sock = _Socket()
    agent.ws, agent.flushing = sock, True  # reconnected: a new report waits behind the unanswered ones
    await agent.send({"type": "checkpoints_dropped", "job_id": 1, "sequences": [1], "reason": "x"})
    assert not sock.sent
    assert await agent._resend_pending(sock, older_than_s=0.0) == 3  # on reconnect, in their order
    assert [m["type"] for m in sock.sent] == ["job_started", "job_exited", "checkpoints_dropped"]
    assert await agent._resend_pending(sock, older_than_s=60.0) == 0  # just sent: not yet again
    first = sock.sent[0]["msg_id"]
    await agent._on_message(json.dumps({"type": "received", "msg_id": first}))
    assert [m["type"] for m, *_ in agent.pending.values()] == ["job_exited", "checkpoints_dropped"]
    assert await agent._resend_pending(sock, older_than_s=0.0) == 2
    assert sock.sent[3]["msg_id"] == sock.sent[1]["msg_id"]  # the same id: the portal de-duplicates


@pytest.mark.asyncio
async def test_hello_lists_what_is_held_and_a_pruned_checkpoint_is_reported(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ck = jobkit.Checkpointer(store_dir(agent.data_dir, "12"), job_id="12", keep_last=2, install_signals=False)
    ck.checkpoint(1, {"w": np.zeros(2)})
    second = ck.checkpoint(2, {"w": np.ones(2)})
    agent.held = agent._scan_held()
    hello = agent._hello()
    assert [(h["job_id"], h["sequence"]) for h in hello["checkpoints"]] == [(12, 2), (12, 1)]
    assert hello["checkpoints"][0]["sha256"] == second.sha256 and not hello["checkpoints_truncated"]
    ck.checkpoint(3, {"w": np.ones(2)})  # the job prunes sequence 1
    await agent.sync_held()
    dropped = agent.ws.of("checkpoints_dropped")
    assert [(d["job_id"], d["sequences"]) for d in dropped] == [(12, [1])] and dropped[0]["msg_id"] in agent.pending
    await agent.sync_held()
    assert len(agent.ws.of("checkpoints_dropped")) == 1  # reported once


@pytest.mark.asyncio
async def test_a_start_whose_restore_checkpoint_is_missing_or_corrupt_reports_it_and_starts_nothing(
        tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    ck = jobkit.Checkpointer(store_dir(agent.data_dir, "9"), job_id="9", install_signals=False)
    corrupt = ck.checkpoint(1, {"w": np.zeros(4)})
    agent.held = agent._scan_held()
    (ck.ckpt_dir / corrupt.file).write_bytes(b"garbage")
    for seq, sha in ((1, corrupt.sha256), (5, "a" * 64)):  # corrupt here; never here
        await agent._on_message(json.dumps({"type": "start_job", "cmd_id": f"s{seq}", "job_id": 9,
                                            "command": "python -c pass", "restore_sequence": seq,
                                            "restore_sha256": sha}))
    assert not agent.jobs
    exits = agent.ws.of("job_exited")
    assert [(e["reason"], e["restore_sequence"]) for e in exits] == [
        ("restore checkpoint missing or corrupt", 1), ("restore checkpoint missing or corrupt", 5)]
    assert {s for d in agent.ws.of("checkpoints_dropped") for s in d["sequences"]} == {1, 5}
    assert not jobkit.list_manifests(ck.ckpt_dir)  # the corrupt one is removed, never offered again
    assert not agent._hello()["checkpoints"]


@pytest.mark.asyncio
async def test_a_late_copy_of_a_reclaim_notice_does_not_push_the_deadline_out(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    await agent._on_message(json.dumps({"type": "reclaim_notice", "cmd_id": "n1", "reclaim_id": 1,
                                        "deadline_in_s": 3600.0, "deadline_at": time.time() - 1.0}))
    for _ in range(50):
        if agent.killswitch:
            break
        await asyncio.sleep(0.02)
    assert agent.killswitch  # the deadline had passed: forced now, not in an hour


def _ambient_caps(status: str) -> int:
    return int(status.split("CapAmb:")[1].split()[0], 16)


@pytest.mark.skipif(os.geteuid() != 0, reason="raising an ambient capability needs root (the suite runs as root)")
def test_job_never_inherits_the_agents_ambient_capabilities(tmp_path: Path) -> None:
    """The agent's unit grants it CAP_NET_ADMIN and friends as ambient capabilities (deploy/, design §18); a job it
    starts must not keep them across its exec."""
    import shutil
    import subprocess

    capsh = shutil.which("capsh")
    assert capsh, "capsh (Debian's libcap2-bin) is needed to give the agent an ambient capability"
    script = tmp_path / "caps.py"
    script.write_text("import pathlib\npathlib.Path('status.txt').write_text(open('/proc/self/status').read())\n")
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import pathlib, sys\n"
        "from nodeagent.runner import start_job\n"
        "pathlib.Path(sys.argv[1], 'agent_status.txt').write_text(open('/proc/self/status').read())\n"
        f"run = start_job(data_dir=pathlib.Path(sys.argv[1]) / 'data', base_dir=pathlib.Path(sys.argv[1]),"
        f" job_id='9', command='python {script}', gpus=[0], interval_s=None, next_sequence=1,"
        " restore_sequence=None, compat={}, kill_with_agent=True)\n"
        "sys.exit(run.proc.wait(timeout=30))\n")
    done = subprocess.run([capsh, "--inh=cap_net_admin", "--addamb=cap_net_admin", "--", "-c",
                           'exec "$0" "$@"', sys.executable, str(agent), str(tmp_path)],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _ambient_caps((tmp_path / "agent_status.txt").read_text()) != 0  # the agent did hold one
    job_status = (tmp_path / "data" / "jobs" / "9" / "work" / "status.txt").read_text()
    assert _ambient_caps(job_status) == 0
