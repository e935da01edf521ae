"""``manage.py export_trace OUT [--since …|--days 30] [--until …] [--sample-s 600]``: the portal's history as a campus trace
(design §7; the mapping is ``portal/whatif/export.py``'s docstring). OUT ending in ``.json`` is one JSON file,
anything else a folder of CSV files; both load with ``python -m scheduler.sim --trace OUT``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from portal.whatif.export import DEFAULT_SAMPLE_S, history_trace
from scheduler.sim.trace import TraceError, save


def _when(value: str, name: str) -> dt.datetime:
    """An ISO date or date-time (local time zone when naive)."""
    parsed = parse_datetime(value)
    if parsed is None:
        day = parse_date(value)
        if day is None:
            raise CommandError(f"--{name}: not an ISO date or date-time: {value!r}")
        parsed = dt.datetime.combine(day, dt.time())
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


class Command(BaseCommand):
    help = "Write the portal's history (nodes, links, jobs, reclaims, bandwidth samples) as a design §7 trace."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("out", help="FILE.json, or a folder for one CSV file per table")
        parser.add_argument("--since", help="ISO date or date-time (default: --days before --until)")
        parser.add_argument("--days", type=float, default=30.0, help="without --since: this many days (default 30)")
        parser.add_argument("--until", help="ISO date or date-time (default: now)")
        parser.add_argument("--sample-s", type=float, default=DEFAULT_SAMPLE_S,
                            help="average bandwidth samples over buckets of this many seconds (0: every sample)")

    def handle(self, *args: Any, **options: Any) -> None:
        until = _when(options["until"], "until") if options["until"] else timezone.now()
        if not options["since"] and not 0 < options["days"] <= 3660:
            raise CommandError("--days: from 0 to 3660")
        since = _when(options["since"], "since") if options["since"] else until - dt.timedelta(days=options["days"])
        try:
            trace = history_trace(since, until, options["sample_s"])
        except TraceError as e:
            raise CommandError(f"cannot export ({e.field}): {e.message}") from None
        save(trace, options["out"])
        counts = ", ".join(f"{trace.n(t)} {t}" for t in ("nodes", "links", "jobs", "reclaims", "research"))
        self.stdout.write(f"export_trace: {options['out']}: {counts}, horizon {trace.horizon_s:.0f} s")
