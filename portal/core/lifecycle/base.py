"""A small, explicit state-machine helper shared by the job and node lifecycles.

A transition is applied with a conditional ``UPDATE … WHERE state = <from>`` so that two workers racing on
the same row cannot both move it: the loser gets :class:`ConcurrentTransition` and nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import models

from portal.core.lifecycle.labels import refusal


class InvalidTransition(Exception):  # noqa: N818 (name is the public contract)
    """The requested transition is not in the state machine; nothing was changed.

    ``str(exc)`` is a sentence for people (``portal.core.lifecycle.labels.refusal``); ``current`` and ``target``
    are the plain state values (never enum members, whose repr would leak into messages)."""

    def __init__(self, machine: str, current: str, target: str) -> None:
        self.machine = machine
        self.current = str(getattr(current, "value", current))
        self.target = str(getattr(target, "value", target))
        super().__init__(refusal(machine, self.current, self.target))


class ConcurrentTransition(Exception):  # noqa: N818 (name is the public contract)
    """The row's state changed under us (another worker moved it first); nothing was changed."""


def apply_transition(
    machine: str,
    allowed: Mapping[str, frozenset[str]],
    obj: models.Model,
    target: str,
    extra_fields: Mapping[str, Any] | None = None,
    field: str = "state",
) -> None:
    """Move ``obj.<field>`` to ``target`` if ``allowed`` permits it, atomically with ``extra_fields``.

    1. Refuse (``InvalidTransition``) if ``target`` is not reachable from the in-memory state.
    2. ``UPDATE … SET field=target, extra… WHERE pk=… AND field=<in-memory state>``.
    3. If no row matched, another writer got there first: raise ``ConcurrentTransition``.
    4. Only then mirror the new values onto ``obj``.
    """
    current = getattr(obj, field)
    if target not in allowed.get(current, frozenset()):
        raise InvalidTransition(machine, current, target)
    values = {field: target, **(extra_fields or {})}
    updated = type(obj)._default_manager.filter(pk=obj.pk, **{field: current}).update(**values)
    if updated != 1:
        raise ConcurrentTransition(f"The {machine} changed meanwhile (it is no longer {current}); reload and retry.")
    for field, value in values.items():
        setattr(obj, field, value)


def reachable(allowed: Mapping[str, frozenset[str]], current: str, target: str) -> bool:
    """Whether ``target`` is one step from ``current``."""
    return target in allowed.get(current, frozenset())


def claim_transition(
    machine: str,
    allowed: Mapping[str, frozenset[str]],
    model: type[models.Model],
    pk: Any,
    current: str,
    target: str,
    extra_fields: Mapping[str, Any] | None = None,
    field: str = "state",
    key: str = "pk",
) -> bool:
    """First one wins: move row ``pk`` from ``current`` to ``target`` if it is still in ``current``.

    For facts that may arrive twice or race each other (a transfer reported received and timed out at once):
    True for the one caller that moved it, False for every other. A transition not in ``allowed`` raises
    ``InvalidTransition`` and changes nothing. ``key`` names the column ``pk`` is matched against.
    """
    if target not in allowed.get(current, frozenset()):
        raise InvalidTransition(machine, current, target)
    values = {field: target, **(extra_fields or {})}
    return model._default_manager.filter(**{key: pk, field: current}).update(**values) == 1
