"""``manage.py seed_campus [--demo-users] [--agent-tokens FILE]``: the paper's campus (design §6).

54 nodes in 4 buildings: 21 RTX 3090, 15 RTX 4090 (1 GPU each), 8 A100 x4, 10 A6000 x2. design §6 lists
20 RTX 3090, which sums to 53 nodes against its stated 54 (the paper counts "plus one coordinator"); like the
simulator's trace generator (``scheduler/sim/tracegen.py``) we add one RTX 3090 so the campus has 54 GPU nodes.
Three-tier tree: 1 Gbit/s access links, 10 Gbit/s building uplinks to one core switch; rates in bytes/s.

No node gets lending windows (design §9.13): every seeded node is lent at any hour, so the demo places work
whenever it is shown and the suites that seed this campus never depend on the wall clock. Providers set windows
per node on their pages.

Idempotent: objects are found by name and only created when missing; existing rows are never changed
(``--agent-tokens`` is the one explicit exception: it rotates every seeded node's agent token).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from portal.core.models import Building, Link, Node, Provider, ResearchGroup, Switch
from portal.core.services import nodes as node_services

GBIT_BYTES_PER_S = 1e9 / 8
ACCESS_BYTES_PER_S = 1 * GBIT_BYTES_PER_S
UPLINK_BYTES_PER_S = 10 * GBIT_BYTES_PER_S
DEMO_PASSWORD = "reclaimnet-demo"

# (building, code, labs, [(catalogue model, short name, nodes, GPUs per node)])
CAMPUS: list[tuple[str, str, list[str], list[tuple[str, str, int, int]]]] = [
    ("Engineering", "eng", ["Vision Lab", "Robotics Lab"],
     [("RTX 3090", "rtx3090", 6, 1), ("RTX 4090", "rtx4090", 4, 1), ("A100", "a100", 2, 4),
      ("RTX A6000", "a6000", 3, 2)]),
    ("Computer Science", "cs", ["Systems Lab", "Graphics Lab"],
     [("RTX 3090", "rtx3090", 5, 1), ("RTX 4090", "rtx4090", 4, 1), ("A100", "a100", 2, 4),
      ("RTX A6000", "a6000", 3, 2)]),
    ("Physics", "phy", ["Physics Compute Lab"],
     [("RTX 3090", "rtx3090", 5, 1), ("RTX 4090", "rtx4090", 4, 1), ("A100", "a100", 2, 4),
      ("RTX A6000", "a6000", 2, 2)]),
    ("Life Sciences", "bio", ["Bio Imaging Lab"],
     [("RTX 3090", "rtx3090", 5, 1), ("RTX 4090", "rtx4090", 3, 1), ("A100", "a100", 2, 4),
      ("RTX A6000", "a6000", 2, 2)]),
]
GROUPS = ["NLP Group", "Computer Vision Group", "Climate Modelling Group", "Protein Design Group"]
# username -> (is_staff, lab, group)
DEMO_USERS: dict[str, tuple[bool, str | None, str | None]] = {
    "admin": (True, None, None),
    "provider": (False, "Vision Lab", None),
    "researcher": (False, None, "NLP Group"),
}


def _slug(name: str) -> str:
    return name.lower().replace(" ", "-")


class Command(BaseCommand):
    help = "Create the paper's 54-node campus (design §6); --demo-users adds admin/provider/researcher logins."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--demo-users", action="store_true",
                            help=f"create users admin, provider, researcher (password {DEMO_PASSWORD!r})")
        parser.add_argument("--agent-tokens", metavar="FILE",
                            help="rotate every seeded node's agent token and write {node: token} JSON to FILE")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            created_nodes = self._campus()
            created_users = self._demo_users() if options["demo_users"] else 0
        if options["agent_tokens"]:
            tokens = {node.name: node_services.rotate_agent_token(node, None)
                      for node in Node.objects.filter(name__in=self._node_names()).order_by("name")}
            _write_secret(Path(options["agent_tokens"]), json.dumps(tokens, indent=1))
        nodes = Node.objects.filter(name__in=self._node_names())
        gpus = sum(node.gpus.count() for node in nodes)
        self.stdout.write(
            f"seed_campus: {Building.objects.count()} buildings, {nodes.count()} nodes ({gpus} GPUs), "
            f"{Provider.objects.count()} labs, {ResearchGroup.objects.count()} groups; "
            f"created {created_nodes} nodes and {created_users} users this run"
        )

    @staticmethod
    def _node_names() -> list[str]:
        return [f"{code}-{short}-{i:02d}" for _, code, _, kinds in CAMPUS for _, short, n, _ in kinds
                for i in range(1, n + 1)]

    def _campus(self) -> int:
        core, _ = Switch.objects.get_or_create(name="core", defaults={"tier": Switch.Tier.CORE})
        for group in GROUPS:
            ResearchGroup.objects.get_or_create(name=group, defaults={"slug": _slug(group)})
        created = 0
        for building_name, code, labs, kinds in CAMPUS:
            building, _ = Building.objects.get_or_create(name=building_name)
            switch, _ = Switch.objects.get_or_create(
                name=f"sw-{code}", defaults={"tier": Switch.Tier.BUILDING, "building": building}
            )
            Link.objects.get_or_create(
                name=f"uplink-{code}",
                defaults={"kind": Link.Kind.UPLINK, "upper": core, "lower_switch": switch,
                          "capacity_bytes_per_s": UPLINK_BYTES_PER_S},
            )
            providers = [Provider.objects.get_or_create(name=lab, defaults={"slug": _slug(lab)})[0] for lab in labs]
            position = 0
            for model, short, count, gpus_per_node in kinds:
                for i in range(1, count + 1):
                    name = f"{code}-{short}-{i:02d}"
                    provider = providers[position % len(providers)]
                    position += 1
                    if Node.objects.filter(name=name).exists():
                        continue
                    node_services.register_node(
                        None, provider=provider, building=building, name=name,
                        gpus=[{"model": model}] * gpus_per_node, access_link_bytes_per_s=ACCESS_BYTES_PER_S,
                    )
                    created += 1
        return created

    def _demo_users(self) -> int:
        user_model = get_user_model()
        created = 0
        for username, (is_staff, lab, group) in DEMO_USERS.items():
            if user_model.objects.filter(username=username).exists():
                continue
            user = user_model.objects.create_user(
                username=username, password=DEMO_PASSWORD, email=f"{username}@campus.example",
                is_staff=is_staff, is_superuser=is_staff,
            )
            if lab:
                Provider.objects.get(name=lab).members.add(user)
            if group:
                ResearchGroup.objects.get(name=group).members.add(user)
            created += 1
        return created


def _write_secret(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600 from creation, never world-readable for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT: tighten it too
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
