"""``reclaimnet``: the portal from a terminal, for researchers and providers (design §13).

    reclaimnet login                      # asks the address, username and password; keeps a token (mode 0600)
    reclaimnet submit job.yaml            # a YAML or JSON spec with the fields of POST /api/jobs/
    reclaimnet jobs                       # your groups' jobs, as squeue lists them
    reclaimnet logs 42 -f                 # the job's output, following it while it runs
    reclaimnet fetch 42 -o out/           # its results, each file checked against its SHA-256

Every read takes ``--json`` (the API's answer, for scripts). Exit status: 0 done, 1 refused (the portal answered
an error, or a check failed), 2 usage (a bad option, an unreadable spec). The address and token come from
``RECLAIMNET_URL`` and ``RECLAIMNET_TOKEN``, else from the file ``reclaimnet login`` writes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import math
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reclaimnet import config
from reclaimnet.client import (
    FOLLOW_INTERVAL_S,
    ApiError,
    AuthError,
    ChecksumMismatch,
    Client,
    Conflict,
    NotFound,
    Refused,
    ServerError,
    Unreachable,
    __version__,
)
from reclaimnet.spec import SpecError, load_spec, parse_duration_s, parse_memory_bytes

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
PROG = "reclaimnet"


class CommandError(Exception):
    """A check on this side failed (not logged in, nothing to show): exit 1 with the message."""


# --- output ---------------------------------------------------------------------------------------------------


def _out(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _print_json(value: Any) -> None:
    _out(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False))


def _when(value: Any) -> str:
    """An ISO 8601 time as local ``YYYY-MM-DD HH:MM``; ``-`` when unset."""
    if not value:
        return "-"
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M")


def _size(n_bytes: Any) -> str:
    if not isinstance(n_bytes, int | float):
        return "-"
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        for key in ("value", "score", "text"):
            if key in value:
                return _cell(value[key])
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return ",".join(_cell(item) for item in value) or "-"
    return str(value)


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, Callable[[dict[str, Any]], Any], int]]) \
        -> None:
    """Rows as aligned columns (header, value of a row, widest a cell may be)."""
    cells = [[_cell(get(row))[:width] for _, get, width in columns] for row in rows]
    widths = [max([len(header), *(len(line[i]) for line in cells)]) for i, (header, _, _) in enumerate(columns)]
    _out("  ".join(header.ljust(widths[i]) for i, (header, _, _) in enumerate(columns)).rstrip())
    for line in cells:
        _out("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())


def _fields(record: dict[str, Any]) -> None:
    """An object as ``field: value`` lines, in the API's order (fields the API adds show up as they come)."""
    width = max((len(key) for key in record), default=0)
    for key, value in record.items():
        if isinstance(value, dict) and isinstance(value.get("text"), str):  # waiting_reason, priority
            value = value["text"]
        if isinstance(value, dict | list) and value and not all(not isinstance(v, dict | list) for v in (
                value.values() if isinstance(value, dict) else value)):
            value = json.dumps(value, ensure_ascii=False)
        _out(f"{key.rjust(width)}: {_cell(value)}")


def _job_ids(answer: Any) -> list[Any]:
    """The ids of the jobs a submit answer describes (one job, a list, or ``{"jobs": [...]}`` for an array)."""
    if isinstance(answer, list):
        return [item.get("id") for item in answer if isinstance(item, dict)]
    if isinstance(answer, dict):
        for key in ("jobs", "results"):
            if isinstance(answer.get(key), list):
                return _job_ids(answer[key])
        if "id" in answer:
            return [answer["id"]]
    return []


# --- the client from the environment ----------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    try:
        client = Client.from_env()
    except ValueError as error:
        raise CommandError(str(error)) from None
    if not client.token:
        raise CommandError(f"Not logged in to {client.url}: run `{PROG} login` (or set RECLAIMNET_TOKEN).")
    return client


def _plain_http_elsewhere(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1")


# --- commands ---------------------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    stored = config.load()
    url = args.url or os.environ.get("RECLAIMNET_URL") or stored.get("url")
    if not url:
        url = input("Portal address (https://…): ").strip()
    username = args.username or input("Username: ").strip()
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {username}: ")
    if not username or not password:
        raise CommandError("A username and a password are needed.")
    if _plain_http_elsewhere(url):
        _err(f"{PROG}: warning: {url} is plain http: the password and token cross the network readable.")
    try:
        token = Client.login(url, username, password)
    except AuthError as error:
        raise CommandError(f"Login refused: {error.message}") from None
    except ValueError as error:
        raise CommandError(str(error)) from None
    me = Client(url, token).me()
    path = config.save({**stored, "url": url.rstrip("/"), "username": username, "token": token})
    roles = ", ".join(me.get("roles", [])) or "no role yet"
    if args.json:
        _print_json({"url": url.rstrip("/"), "username": me.get("username", username), "roles": me.get("roles", []),
                     "config": str(path)})
    else:
        _out(f"Logged in to {url.rstrip('/')} as {me.get('username', username)} ({roles}); token kept in {path}.")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    """Revoke the kept token on the portal, then remove it here, also when the portal cannot revoke it (then
    say so and exit 1: the token still works there until a later logout revokes it)."""
    stored = config.load()
    token, url = stored.get("token"), stored.get("url")
    if not token:
        if args.json:
            _print_json({"revoked": False, "removed": False})
        else:
            _out("Not logged in.")
        return EXIT_OK
    try:
        revoked = Client(str(url or ""), str(token)).logout()
    except (ApiError, ValueError):
        config.forget_token()
        _err(f"{PROG}: the token was removed here, but the portal did not revoke it: it works there until "
             f"revoked (`{PROG} login` and `{PROG} logout` again once the portal answers).")
        raise
    config.forget_token()
    if args.json:
        _print_json({"revoked": revoked, "removed": True})
    elif revoked:
        _out("Logged out: the portal revoked the token and it was removed here.")
    else:
        _out("Logged out: the portal no longer accepted the token; it was removed here.")
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if args.memory is not None:  # design §19.2: the options win over the spec's fields
        spec["memory_bytes"] = args.memory
    if args.cpus is not None:
        spec["cpu_cores"] = args.cpus
    answer = _client(args).submit(spec, idempotency_key=args.idempotency_key)
    if args.json:
        _print_json(answer)
        return EXIT_OK
    ids = _job_ids(answer)
    array = answer.get("array") if isinstance(answer, dict) else None
    if isinstance(array, dict):
        _out(f"Submitted array {array.get('id')} ({array.get('name', '')}, {array.get('spec', '')}): "
             f"{len(ids)} jobs {ids[0]}–{ids[-1]}." if ids else f"Submitted array {array.get('id')}.")
    elif len(ids) == 1 and isinstance(answer, dict) and "id" in answer:
        _out(f"Submitted job {answer['id']} ({answer.get('name', '')}): {answer.get('state', 'queued')}.")
    elif ids:
        _out(f"Submitted {len(ids)} jobs: {', '.join(str(i) for i in ids)}.")
    else:
        _print_json(answer)
    return EXIT_OK


JOB_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], Any], int]] = [
    ("ID", lambda j: j.get("id"), 12),
    ("NAME", lambda j: j.get("name"), 28),
    ("STATE", lambda j: j.get("state"), 10),
    ("GPUS", lambda j: j.get("gpu_count"), 4),
    ("NODE", lambda j: j.get("node"), 20),
    ("GROUP", lambda j: j.get("group_name"), 20),
    ("OWNER", lambda j: j.get("owner"), 16),
    ("SUBMITTED", lambda j: _when(j.get("submitted_at")), 16),
]
# Shown when the API answers them (the fair queue adds them): header, field.
OPTIONAL_JOB_COLUMNS = [("PRIORITY", "priority"), ("EST.START", "estimated_start_at")]


def cmd_jobs(args: argparse.Namespace) -> int:
    filters = {"state": args.state, "group": args.group}
    rows = _client(args).jobs(limit=args.limit or None, **{k: v for k, v in filters.items() if v is not None})
    if args.json:
        _print_json(rows)
        return EXIT_OK
    columns = list(JOB_COLUMNS)
    for header, key in OPTIONAL_JOB_COLUMNS:
        if any(row.get(key) is not None for row in rows):
            columns.append((header, (lambda k: lambda j: _when(j.get(k)) if k.endswith("_at") else j.get(k))(key),
                            20))
    _table(rows, columns)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    job = _client(args).job(args.id)
    if args.json:
        _print_json(job)
    else:
        _fields(job)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if not args.follow:
        answer = client.output(args.id)
        if args.json:
            _print_json(answer)
            return EXIT_OK
        _dropped(answer)
        sys.stdout.write(answer.get("text", ""))
        sys.stdout.flush()
        return EXIT_OK
    for answer in client.follow_output(args.id, interval_s=args.poll):
        if args.json:
            _out(json.dumps(answer, ensure_ascii=False))
            continue
        _dropped(answer)
        sys.stdout.write(answer.get("text", ""))
        sys.stdout.flush()
    if not args.json:
        state = client.job(args.id).get("state")
        _err(f"{PROG}: job {args.id} {state}.")
    return EXIT_OK


def _dropped(answer: dict[str, Any]) -> None:
    if answer.get("truncated"):
        _err(f"[… {_size(answer['truncated'])} of output dropped (the portal keeps the last "
             f"{_size(answer.get('size_cap_bytes'))}) …]")


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _client(args).cancel(args.id)
    if args.json:
        _print_json(job)
    else:
        _out(f"Job {job.get('id', args.id)} ({job.get('name', '')}): {job.get('state')}.")
    return EXIT_OK


def cmd_results(args: argparse.Namespace) -> int:
    listing = _client(args).results(args.id)
    if args.json:
        _print_json(listing)
        return EXIT_OK
    files = listing.get("files", [])
    _table(files, [("PATH", lambda f: f.get("path"), 80), ("SIZE", lambda f: _size(f.get("size_bytes")), 12),
                   ("SHA256", lambda f: f.get("sha256"), 16)])
    _out(f"{len(files)} files, {_size(listing.get('total_bytes'))}; results {listing.get('state', '?')}.")
    return EXIT_OK


def cmd_fetch(args: argparse.Namespace) -> int:
    client = _client(args)
    dest = Path(args.output or f"job-{args.id}")
    if args.checkpoint:
        got = client.fetch_checkpoint(args.id, dest / f"job-{args.id}-checkpoint")
        if args.json:
            _print_json(got)
        else:
            _out(f"Checkpoint of job {args.id}: {got['path']} ({_size(got['size_bytes'])}, SHA-256 checked).")
        return EXIT_OK

    def report(item: dict[str, Any]) -> None:
        if not args.json:
            _out(f"{item['outcome']:<10}  {item['local_path']}  ({_size(item.get('size_bytes'))})")

    fetched = client.fetch(args.id, dest, on_file=report)
    if args.json:
        _print_json(fetched)
        return EXIT_OK
    files = fetched.get("files", [])
    state = fetched.get("state", "?")
    if not files:
        _out(f"Job {args.id} has no results yet (results {state}).")
    else:
        _out(f"{len(files)} files, {_size(fetched.get('total_bytes'))} in {dest}, every SHA-256 checked "
             f"(results {state}).")
    return EXIT_OK


NODE_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], Any], int]] = [
    ("ID", lambda n: n.get("id"), 10),
    ("NAME", lambda n: n.get("name"), 24),
    ("LAB", lambda n: n.get("provider_name"), 20),
    ("STATE", lambda n: (n.get("state") or "-") + (" (kill-switch)" if n.get("killswitch_engaged") else ""), 24),
    ("GPUS", lambda n: len(n.get("gpus") or []), 4),
    ("LENDABLE", lambda n: n.get("lendable_gpu_count"), 8),
    ("MODEL", lambda n: ",".join(sorted({g.get("model", "?") for g in n.get("gpus") or []})), 24),
    ("HEARTBEAT", lambda n: _when(n.get("last_heartbeat_at")), 16),
]


def cmd_nodes(args: argparse.Namespace) -> int:
    client = _client(args)
    filters: dict[str, Any] = {"state": args.state} if args.state else {}
    if not args.all:
        filters["mine"] = True
    rows = client.nodes(**filters)
    if not rows and not args.all:
        me = client.me()
        if not me.get("providers") and not me.get("is_staff"):
            raise CommandError(f"{me.get('username', 'You')} is not a member of a provider lab, so no node is "
                               f"yours to manage (`{PROG} nodes --all` lists every node).")
    if args.json:
        _print_json(rows)
    else:
        _table(rows, NODE_COLUMNS)
    return EXIT_OK


def cmd_reclaim(args: argparse.Namespace) -> int:
    notice_s = None
    if args.notice is not None:
        notice_s = parse_duration_s(args.notice)
        if notice_s is None:
            try:
                notice_s = float(args.notice)
            except ValueError:
                raise CommandError(f"--notice: {args.notice!r} is not seconds or a duration such as 10m.") from None
    event = _client(args).reclaim(args.node, notice_s=notice_s, emergency=args.emergency)
    if args.json:
        _print_json(event)
    else:
        _out(f"Reclaim {event.get('id')} of node {event.get('node_name', args.node)}: {event.get('kind')}, "
             f"notice {_cell(event.get('notice_s'))} s, deadline {_when(event.get('deadline_at'))}.")
    return EXIT_OK


def cmd_lend(args: argparse.Namespace) -> int:
    node = _client(args).lend(args.node)
    if args.json:
        _print_json(node)
    else:
        _out(f"Node {node.get('name', args.node)} is lent again: {node.get('state')} until its agent says hello.")
    return EXIT_OK


# --- the parser -------------------------------------------------------------------------------------------------


def _job_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a job id is a whole number, not {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a whole number, 0 or more, not {text!r}")
    return int(text)


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"seconds, more than 0, not {text!r}")
    return value


# A job's own cgroup limits (design §19.2), as the portal bounds them: checked here so a typo fails at once.
MIN_MEMORY_BYTES, MAX_MEMORY_BYTES = 256 * 2**20, 16 * 2**40
MAX_CPU_CORES = 1024.0


def _memory_bytes(text: str) -> int:
    size = parse_memory_bytes(text)
    if size is None:
        raise argparse.ArgumentTypeError(f"a size with its unit, e.g. 16G or 512M (binary: G = GiB), not {text!r}")
    if not MIN_MEMORY_BYTES <= size <= MAX_MEMORY_BYTES:
        raise argparse.ArgumentTypeError(f"from 256M to 16T, not {text!r}")
    return size


def _cpu_cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_CPU_CORES:  # NaN and infinities fail here too
        raise argparse.ArgumentTypeError(f"a number of cores, more than 0 and at most {MAX_CPU_CORES:g} "
                                         f"(e.g. 4 or 0.5), not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="The ReclaimNet portal from a terminal: submit and follow jobs, fetch their results, "
                               "reclaim and lend nodes.\n\n" + __doc__.split("\n\n")[1],
        epilog="Exit status: 0 done, 1 refused (the portal answered an error, or a check failed), 2 usage. "
               "RECLAIMNET_URL and RECLAIMNET_TOKEN override the address and token kept by `login` "
               f"(in {config.config_path()}).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the API's answer as JSON (for scripts)")

    def command(name: str, run: Callable[[argparse.Namespace], int], help_text: str, description: str = "") \
            -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[as_json], help=help_text, description=description or help_text)
        sub.set_defaults(run=run)
        return sub

    login = command("login", cmd_login, "sign in and keep an API token",
                    "Sign in with your portal username and password and keep the API token in your config "
                    "directory (mode 0600). Asks for what the options do not give.")
    login.add_argument("--url", help="the portal's address, e.g. https://gpu.campus.example (default: "
                                     "RECLAIMNET_URL, then the last one used)")
    login.add_argument("--username", help="your portal username")
    login.add_argument("--password-stdin", action="store_true",
                       help="read the password from the first line of standard input instead of asking")
    command("logout", cmd_logout, "revoke the kept API token and forget it",
            "Revoke the kept API token on the portal, then remove it from the config file. When the portal "
            "cannot be reached the token is removed here all the same, and the exit status is 1.")

    submit = command("submit", cmd_submit, "submit a job from a YAML or JSON spec",
                     "Submit a job. SPEC holds the fields of POST /api/jobs/ (see examples/job.yaml): name, "
                     "command or image, gpu_count, expected_runtime_s, ckpt_bytes_estimate, and optionally group "
                     "(id or name), vram_gb_per_gpu, min_capability, framework, loss_budget_s, "
                     "loss_budget_mode (expected or bound), restart_s, "
                     "priority_class, output_dir, memory_bytes, cpu_cores, array, after_ok, after_any. Durations may be written 4h or "
                     "90m, sizes 3.2GB or 500MiB. The portal checks every field as it checks the web form.")
    submit.add_argument("spec", metavar="SPEC", help="the spec file, or - for standard input")
    submit.add_argument("--idempotency-key", metavar="KEY",
                        help="send this Idempotency-Key (1-200 printable ASCII characters): submitting again "
                             "with the same key and spec within 24 h answers the first job again")
    submit.add_argument("--memory", type=_memory_bytes, metavar="SIZE",
                        help="the job's memory limit, e.g. 16G or 512M (G = GiB; 256M to 16T); it is stopped "
                             "beyond it. Wins over the spec's memory_bytes; neither: the node's default")
    submit.add_argument("--cpus", type=_cpu_cores, metavar="N",
                        help="the job's CPU quota in cores, e.g. 4 or 0.5 (at most 1024). Wins over the spec's "
                             "cpu_cores; neither: the node's default")

    jobs = command("jobs", cmd_jobs, "list your groups' jobs (like squeue)")
    jobs.add_argument("--state", metavar="STATE",
                      help="only jobs in this state (queued, running, migrating, completed, failed, cancelled, …)")
    jobs.add_argument("--group", type=_job_id, metavar="ID", help="only this research group's jobs")
    jobs.add_argument("--limit", type=_count, default=100, metavar="N",
                      help="at most N jobs, newest first (default 100; 0 for all)")

    status = command("status", cmd_status, "show one job", "Show one job: its state, node, progress and why "
                                                           "it waits.")
    status.add_argument("id", type=_job_id, metavar="ID")

    logs = command("logs", cmd_logs, "print a job's output",
                   "Print the tail of a job's output (stdout and stderr, the last 256 KiB the portal keeps). "
                   "With -f, keep printing as it writes until the job ends.")
    logs.add_argument("id", type=_job_id, metavar="ID")
    logs.add_argument("-f", "--follow", action="store_true", help="follow the output until the job ends")
    logs.add_argument("--poll", type=_positive_s, default=FOLLOW_INTERVAL_S, metavar="S",
                      help=f"seconds between reads while following (default {FOLLOW_INTERVAL_S:g})")

    cancel = command("cancel", cmd_cancel, "cancel a job")
    cancel.add_argument("id", type=_job_id, metavar="ID")

    results = command("results", cmd_results, "list a job's result files",
                      "List the files a job left in its output_dir, with their sizes and SHA-256.")
    results.add_argument("id", type=_job_id, metavar="ID")

    fetch = command("fetch", cmd_fetch, "download a job's results (or its final checkpoint)",
                    "Download a job's result files into DIR, keeping their paths; each is checked against its "
                    "SHA-256 before it takes its name, and files already there with the right SHA-256 are "
                    "skipped. With --checkpoint, download the job's final checkpoint instead.")
    fetch.add_argument("id", type=_job_id, metavar="ID")
    fetch.add_argument("-o", "--output", metavar="DIR", help="where to put them (default ./job-ID)")
    fetch.add_argument("--checkpoint", action="store_true", help="the final checkpoint instead of the results")

    nodes = command("nodes", cmd_nodes, "list your labs' nodes (providers)")
    nodes.add_argument("--all", action="store_true", help="every node on campus, not only your labs'")
    nodes.add_argument("--state", metavar="STATE",
                       help="only nodes in this state (registered, online, offline, draining, reclaimed, retired)")

    reclaim = command("reclaim", cmd_reclaim, "take a node back (providers)",
                      "Take a node back. With --notice, its jobs get that long to checkpoint and leave; with "
                      "--emergency they stop now and resume from their freshest replica; with neither, the "
                      "shortest notice with which no hosted job loses work (as the reclaim dialog suggests).")
    reclaim.add_argument("node", metavar="NODE", help="the node's name or id")
    how = reclaim.add_mutually_exclusive_group()
    how.add_argument("--notice", metavar="S", help="seconds of notice (or a duration: 10m, 1h)")
    how.add_argument("--emergency", action="store_true", help="no notice: take it back now")

    lend = command("lend", cmd_lend, "lend a reclaimed node again (providers)")
    lend.add_argument("node", metavar="NODE", help="the node's name or id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse, run, map failures to the exit status."""
    args = build_parser().parse_args(argv)  # usage errors exit 2
    try:
        return int(args.run(args))
    except SpecError as error:
        _err(f"{PROG}: {error}")
        return EXIT_USAGE
    except ApiError as error:
        _report(args, error)
        return EXIT_REFUSED
    except (CommandError, ValueError) as error:
        _err(f"{PROG}: {error}")
        if getattr(args, "json", False):
            _out(json.dumps({"error": {"status": None, "message": str(error), "fields": {}}}))
        return EXIT_REFUSED
    except KeyboardInterrupt:
        _err("")
        return 130


ERROR_WORDS = [(NotFound, "not found"), (Conflict, "conflict"), (AuthError, "refused"), (Refused, "refused"),
               (ServerError, "portal error"), (Unreachable, "unreachable"), (ChecksumMismatch, "check failed")]


def _report(args: argparse.Namespace, error: ApiError) -> None:
    """The error on stderr, led by what kind it is and its status (with ``--json`` also on stdout)."""
    lines = error.message.splitlines() or [type(error).__name__]
    word = next((text for kind, text in ERROR_WORDS if isinstance(error, kind)), "error")
    status = f" ({error.status})" if error.status else ""
    if error.fields:
        _err(f"{PROG}: {word}{status}:")
        for line in lines:
            _err(f"  {line}")
    else:
        _err(f"{PROG}: {word}{status}: {lines[0]}" + "".join(f"\n  {line}" for line in lines[1:]))
    if error.status == 401:
        _err(f"{PROG}: your token was not accepted: run `{PROG} login`.")
    if isinstance(error, Refused) and error.retry_after_s:
        _err(f"{PROG}: try again in {error.retry_after_s:g} s.")
    if getattr(args, "json", False):
        _out(json.dumps({"error": {"status": error.status, "message": error.message, "fields": error.fields}},
                        ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
