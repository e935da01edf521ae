"""Job output, agent side (design §9.11): what a run prints is read from its log, cleaned, capped, and shipped as
bounded, reliable ``job_output`` reports that never crowd out the rest of the link."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import build_config
from nodeagent.output import (
    BATCH_BYTES,
    FLUSH_S,
    MESSAGES_BURST,
    PENDING_CAP_BYTES,
    TAIL_CHARS,
    OutputShipper,
    OutputTail,
)
from portal.control.link.protocol import MAX_MESSAGE_BYTES, MAX_OUTPUT_TEXT_CHARS, validate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tail(tmp_path: Path, before: bytes = b"") -> tuple[Path, OutputTail, Clock]:
    log = tmp_path / "job.log"
    log.write_bytes(before)
    clock = Clock()
    return log, OutputTail(log, len(before), clock=clock), clock


def _append(log: Path, data: bytes) -> None:
    with log.open("ab") as f:
        f.write(data)


def test_only_this_runs_output_is_read_cleaned_of_escapes_and_control_characters(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path, before=b"the previous run on this node\n")
    _append(log, b"\x1b[31mred\x1b[0m text\ttab\x07\x00\n\x1b]0;window title\x07loss 0.5\n"
                 b"bad byte \xff here\n\xe2\x80\xaeevil\n")
    out.poll()
    assert out.pending == "red text\ttab\nloss 0.5\nbad byte \ufffd here\nevil\n"
    assert "previous run" not in out.pending


def test_a_progress_bar_redrawn_with_carriage_returns_keeps_its_last_state(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path)
    _append(log, b"epoch 1\r 10%|#     |\r 50%|###   |\r100%|######|\r\nepoch 2 done\r\n")
    out.poll()
    assert out.pending == "100%|######|\nepoch 2 done\n"


def test_an_unfinished_line_waits_for_its_end_or_flush_s_and_a_redraw_after_it_starts_a_new_line(
        tmp_path: Path) -> None:
    log, out, clock = _tail(tmp_path)
    _append(log, b"step 1 ok\ndownloading 10%")
    out.poll()
    assert out.pending == "step 1 ok\n"  # the unfinished line is held
    clock.now += FLUSH_S
    out.poll()
    assert out.pending == "step 1 ok\ndownloading 10%"  # held long enough: shipped as it is
    _append(log, b"\rdownloading 100%\n")
    out.poll()
    assert out.pending == "step 1 ok\ndownloading 10%\ndownloading 100%\n"


def test_a_character_split_between_two_reads_is_decoded_whole(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path)
    data = "λ = 0.1 ✓\n".encode()
    _append(log, data[:1])
    out.poll()
    _append(log, data[1:])
    out.poll()
    assert out.pending == "λ = 0.1 ✓\n"


def test_pending_output_is_capped_and_what_was_dropped_is_counted(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path)
    lines = b"".join(b"line %06d %s\n" % (i, b"x" * 80) for i in range(4000))  # ~370 KB at once
    _append(log, lines)
    out.poll()
    assert out.pending_bytes <= PENDING_CAP_BYTES
    assert out.pending.startswith("line ") and out.pending.endswith("\n")  # whole lines kept
    sent = []
    while out.has_news:
        text, skipped = out.take()
        sent.append((text, skipped))
    assert sum(len(t.encode()) for t, _ in sent) + sum(s for _, s in sent) == len(lines)
    assert sent[0][1] > 0 and all(s == 0 for _, s in sent[1:])  # the drop is reported once, before what follows
    assert sent[-1][0].endswith("line 003999 " + "x" * 80 + "\n")


def test_batches_are_at_most_16_kib_and_end_at_a_line_break(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path)
    _append(log, b"".join(b"%05d %s\n" % (i, b"y" * 100) for i in range(400)))
    out.poll()
    text, _ = out.take()
    assert len(text.encode()) <= BATCH_BYTES and text.endswith("\n")
    assert len(text.encode()) > BATCH_BYTES - 200  # filled up to the last whole line


def test_the_tail_for_job_exited_keeps_the_last_characters(tmp_path: Path) -> None:
    log, out, _ = _tail(tmp_path)
    _append(log, b"".join(b"%05d\n" % i for i in range(5000)) + b"Traceback: ValueError: bad lr\n")
    out.poll()
    assert len(out.tail) == TAIL_CHARS and out.tail.endswith("ValueError: bad lr\n")


def test_the_worst_text_still_fits_one_message_the_portal_accepts(tmp_path: Path) -> None:
    """Four-byte characters, two-byte ones, quotes and invalid bytes all escape to several JSON bytes: a batch
    stays within the portal's frame and its text within the protocol's cap."""
    log, out, clock = _tail(tmp_path)
    worst = ("😀" * 3000 + "é\"\\" * 3000 + "\n").encode() + b"\xff" * 6000 + b"\n"
    _append(log, worst)
    out.poll()
    shipper = OutputShipper(clock=clock)
    while out.has_news:
        msgs = shipper.due({"7": _Run(out)}, {})
        clock.now += FLUSH_S
        for msg in msgs:
            assert len(json.dumps(msg).encode()) <= MAX_MESSAGE_BYTES
            assert len(msg["text"]) <= MAX_OUTPUT_TEXT_CHARS
            assert validate(msg) == "job_output"


class _Run:
    def __init__(self, output: OutputTail | None) -> None:
        self.output = output


def _runs(tmp_path: Path, n: int, clock: Clock) -> tuple[dict[str, _Run], list[Path]]:
    runs, logs = {}, []
    for i in range(n):
        log = tmp_path / f"job{i}.log"
        log.write_bytes(b"")
        runs[str(i + 1)] = _Run(OutputTail(log, 0, clock=clock))
        logs.append(log)
    return runs, logs


def test_one_report_per_job_in_flight_and_the_next_after_the_answer_and_flush_s(tmp_path: Path) -> None:
    clock = Clock()
    runs, (log,) = _runs(tmp_path, 1, clock)
    shipper = OutputShipper(clock=clock)
    unanswered: dict[str, Any] = {}
    _append(log, b"a\n")
    (first,) = shipper.due(runs, unanswered)
    assert first["type"] == "job_output" and first["job_id"] == 1 and first["text"] == "a\n"
    unanswered[first["msg_id"]] = first  # the agent keeps it until the portal answers
    _append(log, b"b\n" * 5000)
    clock.now += 10 * FLUSH_S
    assert shipper.due(runs, unanswered) == []  # the first report is unanswered: the next one waits
    del unanswered[first["msg_id"]]  # answered
    (second,) = shipper.due(runs, unanswered)
    assert second["msg_id"] != first["msg_id"] and second["text"] == "b\n" * 5000
    _append(log, b"c\n")
    assert shipper.due(runs, {}) == []  # less than a batch waits: not before FLUSH_S
    clock.now += FLUSH_S
    assert [m["text"] for m in shipper.due(runs, {})] == ["c\n"]
    clock.now += FLUSH_S / 4
    _append(log, b"d" * BATCH_BYTES + b"\n")
    assert len(shipper.due(runs, {})) == 1  # a full batch waits: sooner than FLUSH_S


def test_output_reports_of_all_jobs_stay_within_two_a_second(tmp_path: Path) -> None:
    clock = Clock()
    runs, logs = _runs(tmp_path, 8, clock)
    shipper = OutputShipper(clock=clock)
    sent = 0
    for _ in range(100):  # 10 s of watch-loop passes, every job printing all the time
        for log in logs:
            _append(log, b"x" * 2000 + b"\n")
        sent += len(shipper.due(runs, {}))
        clock.now += 0.1
    assert sent <= MESSAGES_BURST + 2 * 10
    assert sent >= 2 * 10 - 1  # and the budget is used


def test_a_run_that_ends_ships_its_newest_output_in_one_report_even_with_one_in_flight(tmp_path: Path) -> None:
    clock = Clock()
    runs, (log,) = _runs(tmp_path, 1, clock)
    shipper = OutputShipper(clock=clock)
    _append(log, b"start\n")
    (first,) = shipper.due(runs, {})
    _append(log, b"".join(b"%06d\n" % i for i in range(10_000)) + b"no newline at the end")
    last = shipper.final("1", runs["1"].output)
    assert last is not None and last["final"] is True and last["msg_id"] != first["msg_id"]
    assert last["text"].endswith("009999\nno newline at the end") and len(last["text"].encode()) <= BATCH_BYTES
    assert last["skipped_bytes"] == 70_021 - len(last["text"].encode())
    assert shipper.final("1", runs["1"].output) is None  # nothing more


# --- the agent: a real job process --------------------------------------------------------------------------
class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))


def _agent(tmp_path: Path) -> Any:
    from nodeagent.agent import Agent

    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off", "base_dir": str(tmp_path)}, {})
    agent = Agent(cfg)
    agent.ws = _Socket()
    return agent


@pytest.mark.asyncio
async def test_a_failing_job_ships_its_output_then_exits_with_its_tail(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    script = tmp_path / "fail.py"
    script.write_text("import sys\nfor i in range(3):\n    print(f'step {i}')\n"
                      "print('ValueError: learning rate must be positive', file=sys.stderr)\nsys.exit(2)\n")
    await agent._on_message(json.dumps({"type": "start_job", "cmd_id": "s1", "job_id": 31,
                                        "command": "python fail.py", "gpus": [0]}))
    for _ in range(200):
        await agent._watch_once()
        if any(m["type"] == "job_exited" for m in agent.ws.sent):
            break
        await asyncio.sleep(0.05)
    kinds = [m["type"] for m in agent.ws.sent if m["type"] != "ack"]
    assert kinds[0] == "job_started" and kinds[-1] == "job_exited" and "job_output" in kinds
    output = "".join(m["text"] for m in agent.ws.sent if m["type"] == "job_output")
    assert output == "step 0\nstep 1\nstep 2\nValueError: learning rate must be positive\n"
    exited = agent.ws.sent[-1]
    assert exited["returncode"] == 2 and exited["output_tail"].endswith("learning rate must be positive\n")
    ids = [m["msg_id"] for m in agent.ws.sent if m["type"] in ("job_output", "job_started", "job_exited")]
    assert len(set(ids)) == len(ids) and all(i in agent.pending for i in ids)  # kept until answered
    assert not agent.jobs


@pytest.mark.asyncio
async def test_a_second_run_on_the_same_node_ships_only_its_own_output(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    for run, word in ((1, "first"), (2, "second")):
        await agent._on_message(json.dumps({"type": "start_job", "cmd_id": f"s{run}", "job_id": 8,
                                            "command": f"python -c \"print('{word}')\"", "gpus": [0]}))
        for _ in range(200):
            await agent._watch_once()
            if "8" not in agent.jobs:
                break
            await asyncio.sleep(0.05)
    texts = [m["text"] for m in agent.ws.sent if m["type"] == "job_output"]
    assert texts == ["first\n", "second\n"]
