"""Fixtures of the notify tests (design §12): a small world, real receivers on loopback, fast retries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.notify.servers import Receiver, SmtpSink
from tests.portal import factories as f


@dataclass
class World:
    researcher: Any
    colleague: Any
    outsider: Any
    provider_user: Any
    admin: Any
    group: Any
    other_group: Any
    lab: Any
    node: Any
    job: Any


@pytest.fixture
def world(db: Any) -> World:
    users = {name: f.make_user(name, staff=name == "admin") for name in
             ("alice", "bob", "carol", "pat", "admin")}
    for name, user in users.items():
        user.email = f"{name}@campus.example"
        user.save(update_fields=["email"])
    group = f.make_group("NLP", members=(users["alice"], users["bob"]))
    other_group = f.make_group("Vision", members=(users["carol"],))
    lab = f.make_provider("Vision Lab", members=(users["pat"],))
    node, _ = f.make_node(lab, f.make_building(), name="lab-a-01", gpus=2)
    job = f.make_job(group, users["alice"], name="bert-finetune")
    return World(users["alice"], users["bob"], users["carol"], users["pat"], users["admin"], group, other_group,
                 lab, node, job)


@pytest.fixture
def fast_retries(settings: Any) -> dict[str, Any]:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "RETRY_BASE_S": 0.0, "MAX_ATTEMPTS": 3,
                                  "WEBHOOK_TIMEOUT_S": 2.0}
    return settings.RECLAIMNET_NOTIFY


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def smtp(settings: Any) -> Iterator[SmtpSink]:
    sink = SmtpSink().start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = "127.0.0.1", sink.port, False
    yield sink
    sink.stop()
