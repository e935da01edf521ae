"""``manage.py seed_history [--hours N] [--seed S]``: two days of campus history for the pages (after seed_campus)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from portal.web.demo_history import seed_history


class Command(BaseCommand):
    help = "Write a believable past (placements, checkpoints, reclaims, migrations, estimates); once only."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hours", type=int, default=48)
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--past-only", action="store_true",
                            help="leave node states alone and finish every job (for a demo with a live control plane)")

    def handle(self, *args: Any, **options: Any) -> None:
        counts = seed_history(hours=options["hours"], seed=options["seed"], past_only=options["past_only"])
        if counts.get("skipped"):
            self.stdout.write("seed_history: history exists already; nothing written")
        else:
            self.stdout.write("seed_history: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
