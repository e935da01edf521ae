"""The embedded default (SQLite, no Redis) takes concurrent writes: WAL, IMMEDIATE write transactions, and the
outbox relayed by the in-process loop rather than inside the request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, threading
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
call_command("migrate", verbosity=0)
from portal.core import outbox
from portal.core.models import OutboxMessage

with connection.cursor() as cur:
    cur.execute("PRAGMA journal_mode")
    journal = cur.fetchone()[0]
errors = []

def writer(n):
    from django.db import connection as c
    try:
        for i in range(40):
            with transaction.atomic():  # read, then write: the pattern that deadlocks deferred transactions
                OutboxMessage.objects.filter(task_name="probe").count()
                outbox.enqueue("probe", n, i)
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        c.close()

threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"journal": journal, "errors": errors[:3], "rows": OutboxMessage.objects.count(),
                  "mode": outbox.relay_mode(), "eager": settings.CELERY_TASK_ALWAYS_EAGER}))
"""


def _probe(tmp_path: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "RECLAIMNET_TESTING": "1",
                "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(REPO)})
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_embedded_default_uses_wal_and_takes_concurrent_read_then_write_transactions(tmp_path: Path) -> None:
    result = _probe(tmp_path)
    assert result["journal"] == "wal"
    assert result["errors"] == []  # no "database is locked"
    assert result["rows"] == 8 * 40
    assert (result["mode"], result["eager"]) == ("loop", True)  # relayed by the in-process loop
