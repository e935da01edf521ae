"""Benchmark (design §12): a slow webhook receiver and a dead mail server never delay a reclaim.

Reclaim request → the agent receiving its command (a kill-switch, as scripts/bench_e2e.py times it), p50 and
p99, measured side by side in one run on one stack: blocks of samples alternate between *healthy* (the webhook
receiver answers at once, the SMTP server answers) and *unhealthy* (the receiver sleeps 30 s before answering,
the mail server accepts connections and never speaks). Every reclaim notifies: its lab's three members and two
admins each have an address and a webhook (10 deliveries per reclaim). The stack is the harshest for this
property: daphne and ONE solo Celery worker with beat consuming every queue, notifications included.

The last line: ``notify: reclaim -> agent command p99 healthy X ms, unhealthy Y ms (ratio R; goal <= 1.20) PASS|FAIL``.
Runs on its own database (``rn_notify_bench``, recreated) and Redis database 4.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "scripts"))

import harness  # noqa: E402
from bench_e2e import ACT_TIMEOUT_S, RemoteAgents, pct  # noqa: E402

BENCH_DB = "rn_notify_bench"
SLOW_RECEIVER_S = 30.0
GOAL_RATIO = 1.20


def _setup_django(database_url: str, redis_url: str) -> None:
    import psycopg

    admin = database_url.rsplit("/", 1)[0].replace("postgres://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    os.environ.update(DATABASE_URL=database_url, REDIS_URL=redis_url, RECLAIMNET_TESTING="1",
                      DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _subscribers(webhook_url: str) -> None:
    """Three members of the lab and two admins, each with an address, a webhook and mail at once for the two
    events a kill-switch raises (reclaim.forced to admins, reclaim.done to the lab)."""
    from django.contrib.auth import get_user_model

    from portal.core.models import Provider
    from portal.notify.api import create_webhook
    from portal.notify.models import Preference

    lab = Provider.objects.get(slug="e2e-lab")
    users = get_user_model().objects
    for k in range(3):
        member = users.create_user(f"bench-member-{k}", email=f"member{k}@campus.example")
        lab.members.add(member)
        Preference.objects.create(user=member, event="reclaim.done", email="now", webhook=True)
        create_webhook(member, url=webhook_url)
    for k in range(2):
        admin = users.create_user(f"bench-admin-{k}", email=f"admin{k}@campus.example", is_staff=True)
        create_webhook(admin, url=webhook_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6, help="alternating healthy/unhealthy blocks")
    parser.add_argument("--per-block", type=int, default=20, help="reclaims per block")
    args = parser.parse_args(argv)

    base = os.environ.get("DATABASE_URL", "postgres://reclaimnet@127.0.0.1:5432/reclaimnet")
    database_url = base.rsplit("/", 1)[0] + f"/{BENCH_DB}"
    redis_url = harness.redis_db(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), 4)
    _setup_django(database_url, redis_url)
    from tests.notify.servers import Receiver, SmtpSink

    smtp = SmtpSink().start()
    mail_link = harness.CuttableLink(smtp.port)  # cut: the mail server accepts and never speaks
    receiver = Receiver().start()
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-bench-notify-"))
    st = harness.Stack(workdir, database_url, redis_url, heartbeat_interval_s=5.0, heartbeat_timeout_s=600.0,
                       control_period_s=2.0, extra_env={
                           "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(mail_link.port), "LOG_LEVEL": "WARNING"})
    st.flush_redis()
    n_nodes = args.blocks * args.per_block
    nodes = harness.make_campus([(f"sim-{i:04d}", "ABCD"[i % 4]) for i in range(n_nodes)], gpus_per_node=1)
    latencies: dict[str, list[float]] = {"healthy": [], "unhealthy": []}
    lost = {"healthy": 0, "unhealthy": 0}
    sims = None
    try:
        st.start_portal()
        st.start_worker()
        from portal.core.models import Node
        from portal.core.services.reclaims import request_reclaim

        sims = RemoteAgents(st.portal_ws, {pk: tok for pk, tok in nodes.values()})
        sims.start()
        harness.wait_for(lambda: Node.objects.filter(name__startswith="sim-", state="online").count() == n_nodes,
                         240, interval_s=0.5, what=f"{n_nodes} simulated agents online")
        _subscribers(receiver.url)  # after the agents' hellos: their "node returned" is not what is timed
        time.sleep(4.0)
        names = sorted(nodes)
        for block in range(args.blocks):
            mode = "healthy" if block % 2 == 0 else "unhealthy"
            receiver.delay_s = 0.0 if mode == "healthy" else SLOW_RECEIVER_S
            (mail_link.heal if mode == "healthy" else mail_link.cut)()
            for name in names[block * args.per_block:(block + 1) * args.per_block]:
                node_id = nodes[name][0]
                t0 = time.time()
                request_reclaim(Node.objects.get(pk=node_id), None, 0.0)
                try:
                    harness.wait_for(lambda n=node_id: (n, "killswitch") in sims.arrived, ACT_TIMEOUT_S,
                                     interval_s=0.001, what="agent acting")
                    latencies[mode].append((sims.arrived[(node_id, "killswitch")] - t0) * 1000)
                except TimeoutError:  # counted at the timeout: a lost command must show in the p99
                    latencies[mode].append(ACT_TIMEOUT_S * 1000)
                    lost[mode] += 1
                time.sleep(0.1)
            values = latencies[mode][-args.per_block:]
            print(f"  block {block + 1} ({mode}): p50 {pct(values, 50):.1f} ms, p99 {pct(values, 99):.1f} ms "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)
        time.sleep(3.0)
        from django.db.models import Count

        from portal.notify.models import Attempt, Delivery

        by_status = dict(Delivery.objects.values_list("status").annotate(n=Count("pk")))
        failed = Attempt.objects.exclude(error="").count()
        print(f"  deliveries: {Delivery.objects.count()} ({by_status}); attempts {Attempt.objects.count()}, "
              f"{failed} failed (timeouts, silent mail server); mail received {len(smtp.messages)}, "
              f"webhook requests {len(receiver.received)}", flush=True)
    finally:
        if sims is not None:
            sims.stop()
        st.stop_all()
        receiver.stop()
        mail_link.close()
        smtp.stop()
        if not os.environ.get("RECLAIMNET_E2E_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
    for mode, values in latencies.items():
        print(f"  {mode:9s}: {len(values)} reclaims, p50 {pct(values, 50):.1f} ms, p99 {pct(values, 99):.1f} ms, "
              f"max {max(values, default=float('nan')):.1f} ms{f', {lost[mode]} lost' if lost[mode] else ''}",
              flush=True)
    healthy, unhealthy = pct(latencies["healthy"], 99), pct(latencies["unhealthy"], 99)
    ratio = unhealthy / healthy if healthy else float("inf")
    ok = ratio <= GOAL_RATIO and not any(lost.values())
    print(f"notify: reclaim -> agent command p99 healthy {healthy:.1f} ms, receiver sleeping "
          f"{SLOW_RECEIVER_S:.0f} s + mail server down {unhealthy:.1f} ms (ratio {ratio:.2f}; goal <= "
          f"{GOAL_RATIO:.2f}) {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
