"""``manage.py demo_agents --count N --portal URL``: run simulated agents for seeded nodes (the demo).

``seed_campus`` creates nodes in state ``registered`` with no agent. This command rotates the agent tokens of N
of them (the demo provider's lab first, so the ``provider`` login can reclaim them), starts one real agent per
node (``python -m nodeagent``, simulated GPUs matching the node's GPU rows), optionally queues small numpy
training jobs as the demo researcher, and stops its agents on exit. Tokens never leave this process except in
the agents' environments (never their command lines, which any local user can read).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models import Job, Node
from portal.core.services.jobs import submit_job
from portal.core.services.nodes import rotate_agent_token

DEMO_JOB = "python examples/train_numpy.py --steps 20000 --step-sleep 0.05 --pad-bytes 2000000"


class Command(BaseCommand):
    help = "Start simulated node agents for N seeded nodes (rotating their tokens) and keep them running."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=4)
        parser.add_argument("--portal", default="ws://127.0.0.1:8000/ws/agent/")
        parser.add_argument("--data-dir", default=str(Path(settings.BASE_DIR) / ".demo" / "agents"))
        parser.add_argument("--provider", default="vision-lab", help="slug of the lab whose nodes go first")
        parser.add_argument("--submit-jobs", type=int, default=2, help="demo training jobs to queue")

    def handle(self, *args: Any, **options: Any) -> None:

        count = options["count"]
        if count < 1:
            raise CommandError("--count must be >= 1")
        nodes = sorted(Node.objects.exclude(state__in=["retired"]).select_related("provider").prefetch_related("gpus"),
                       key=lambda n: (n.provider.slug != options["provider"], n.gpus.count() != 1, n.name))[:count]
        if not nodes:
            raise CommandError("no nodes: run `manage.py seed_campus` first")
        procs: list[subprocess.Popen[bytes]] = []
        base = Path(options["data_dir"])
        for node in nodes:
            token = rotate_agent_token(node, None)
            gpus = [{"model": g.model, "vram_gb": g.vram_gb, "capability": float(g.compute_capability)}
                    for g in node.gpus.order_by("index")] or 1
            data_dir = base / node.name
            data_dir.mkdir(parents=True, exist_ok=True)
            log = open(data_dir / "agent.log", "ab")  # noqa: SIM115  (owned by the child)
            procs.append(subprocess.Popen(  # token in the environment: a command line is readable by anyone
                [sys.executable, "-m", "nodeagent", "--portal", options["portal"],
                 "--data-dir", str(data_dir), "--simulate-gpus", json.dumps(gpus), "--base-dir",
                 str(settings.BASE_DIR), "--allow-unconfined-jobs"],  # a demo: jobs run as you where need be
                stdout=log, stderr=subprocess.STDOUT, cwd=settings.BASE_DIR,
                env={**os.environ, "RECLAIMNET_AGENT_TOKEN": token}))
            log.close()
            self.stdout.write(f"agent for {node.name} ({node.provider.name}) started, pid {procs[-1].pid}")
        if options["submit_jobs"]:
            time.sleep(3.0)  # let the agents say hello so the jobs find online nodes
            self._submit(options["submit_jobs"])
        stopping = False

        def _stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            while not stopping and any(p.poll() is None for p in procs):
                time.sleep(0.5)
        finally:
            for p in procs:  # only the agents this command started
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()

    def _submit(self, n_jobs: int) -> None:
        from django.contrib.auth import get_user_model


        user = get_user_model().objects.filter(username="researcher").first()
        group = user.research_groups.first() if user is not None else None
        if user is None or group is None:
            self.stdout.write("no demo researcher (seed_campus --demo-users): not queueing demo jobs")
            return

        live = Job.objects.filter(name__startswith="demo-numpy-").exclude(state__in=TERMINAL).count()
        for k in range(live, n_jobs):
            # Queued in the outbox; the control loop inside daphne relays and places it.
            job = submit_job(user, group=group, name=f"demo-numpy-{k + 1}", gpu_count=1, expected_runtime_s=1000,
                             ckpt_bytes_estimate=2_000_000, command=DEMO_JOB, loss_budget_s=120, restart_s=2)
            self.stdout.write(f"queued demo job #{job.pk} ({job.name})")
