"""The audit trail: who did what to which object (design §1 "Who may do what")."""

from __future__ import annotations

from typing import Any

from django.db import models

from portal.core.models import AuditLog


def audit(actor: Any, action: str, obj: models.Model, **detail: Any) -> AuditLog:
    """Record ``actor`` (a User, or None for the system) doing ``action`` to ``obj``."""
    return AuditLog.objects.create(
        actor=actor if actor is not None and getattr(actor, "is_authenticated", False) else None,
        action=action[:64],
        object_type=obj._meta.model_name or type(obj).__name__.lower(),
        object_id=str(obj.pk),
        detail=detail,
    )
