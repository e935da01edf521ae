"""Provider-side node operations (design §1): register, update, lending windows, agent tokens, lend again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from portal.core import outbox, permissions
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.models import Building, Gpu, LendingWindow, Link, Node, Provider, Switch
from portal.core.models.nodes import OwnerUsePolicy, hash_agent_token, new_agent_token
from portal.core.services._validate import NAME_RE, fail, integer, number, text
from portal.core.services.audit import audit
from portal.core.services.gpu_catalogue import GPU_CATALOGUE, lookup_gpu

ACCESS_LINK_DEFAULT_BYTES_PER_S = 125e6  # 1 Gbit/s (design §1 access tier)
MAX_GPUS_PER_NODE = 16
MAX_LENDING_WINDOWS = 64
MAX_LINK_BYTES_PER_S = 1e12  # 8 Tbit/s: anything above is a typo


def _require_node_manager(actor: Any, node: Node) -> None:
    if actor is not None and not permissions.can_manage_node(actor, node):
        raise PermissionDenied("Only members of the node's provider lab (or an admin) may do this.")


def _clean_gpus(gpus: Any) -> list[dict[str, Any]]:
    """Validate the declared GPUs; fill VRAM and capability from the catalogue."""
    if not isinstance(gpus, Sequence) or isinstance(gpus, str) or not gpus:
        fail("gpus", "Declare at least one GPU, as a list.")
    if len(gpus) > MAX_GPUS_PER_NODE:
        fail("gpus", f"At most {MAX_GPUS_PER_NODE} GPUs per node.")
    cleaned = []
    for index, gpu in enumerate(gpus):
        if not isinstance(gpu, Mapping):
            fail("gpus", f"GPU {index}: an object is required.")
        spec = lookup_gpu(gpu.get("model"))
        if spec is None:
            known = ", ".join(sorted(GPU_CATALOGUE))
            fail("gpus", f"GPU {index}: unknown model {gpu.get('model')!r}; known models: {known}.")
        vram = gpu.get("vram_gb")
        vram_gb = spec.vram_gb if vram is None else number("gpus", vram, minimum=0.5, maximum=1024)
        cap = gpu.get("compute_capability")
        try:
            capability = spec.compute_capability if cap is None else Decimal(str(cap)).quantize(Decimal("0.1"))
        except InvalidOperation:
            fail("gpus", f"GPU {index}: compute_capability must be a number like 8.6.")
        if not Decimal("1.0") <= capability <= Decimal("99.9"):
            fail("gpus", f"GPU {index}: compute_capability must be between 1.0 and 99.9.")
        cleaned.append(
            {
                "index": index,
                "model": spec.model,
                "vram_gb": vram_gb,
                "compute_capability": capability,
                "driver_version": text("gpus", gpu.get("driver_version", ""), max_length=32),
                "cuda_version": text("gpus", gpu.get("cuda_version", ""), max_length=16),
                "uuid": text("gpus", gpu.get("uuid", ""), max_length=64),
            }
        )
    return cleaned


def _clean_windows(windows: Any) -> list[dict[str, Any]]:
    if not isinstance(windows, Iterable) or isinstance(windows, str | Mapping):
        fail("lending_windows", "A list of windows is required.")
    windows = list(windows)
    if len(windows) > MAX_LENDING_WINDOWS:
        fail("lending_windows", f"At most {MAX_LENDING_WINDOWS} windows.")
    cleaned = []
    for number_, window in enumerate(windows, start=1):  # people count windows from 1
        if not isinstance(window, Mapping):
            fail("lending_windows", f"Window {number_}: give a day, a start and an end.")
        weekday = integer("lending_windows", window.get("weekday"), minimum=0, maximum=6)
        start, end = window.get("start_time"), window.get("end_time")
        if not isinstance(start, dt.time) or not isinstance(end, dt.time):
            fail("lending_windows", f"Window {number_}: give its start and end as times of day (HH:MM).")
        if start == end:
            fail("lending_windows", f"Window {number_}: it must not start and end at the same time.")
        cleaned.append({"weekday": weekday, "start_time": start, "end_time": end})
    return cleaned


def _building_switch(building: Building) -> Switch:
    switch = Switch.objects.filter(building=building, tier=Switch.Tier.BUILDING).order_by("pk").first()
    if switch is None:
        fail("building", f"Building {building.name!r} has no building switch in the campus topology.")
    return switch  # type: ignore[return-value]


def register_node(
    actor: Any,
    *,
    provider: Provider,
    building: Building,
    name: str,
    gpus: Sequence[Mapping[str, Any]],
    gpu_floor: int = 0,
    access_link_bytes_per_s: float = ACCESS_LINK_DEFAULT_BYTES_PER_S,
    lending_windows: Iterable[Mapping[str, Any]] = (),
) -> tuple[Node, str]:
    """Register a lent node (design §1): node, GPUs, access link and windows in one transaction.

    Returns ``(node, raw_agent_token)``; the token is shown once and stored only as its SHA-256.
    """
    if actor is not None and not permissions.can_manage_provider(actor, provider):
        raise PermissionDenied("You may only register nodes for a provider lab you belong to.")
    name = text("name", name, max_length=100, required=True, pattern=NAME_RE)
    cleaned_gpus = _clean_gpus(gpus)
    gpu_floor = integer("gpu_floor", gpu_floor, minimum=0, maximum=len(cleaned_gpus))
    capacity = number("access_link_bytes_per_s", access_link_bytes_per_s, minimum=1.0,
                      maximum=MAX_LINK_BYTES_PER_S)
    windows = _clean_windows(lending_windows)
    try:
        return _create_node(actor, provider, building, name, cleaned_gpus, gpu_floor, capacity, windows)
    except IntegrityError:  # a concurrent registration took the name between our check and our insert
        fail("name", f"A node named {name!r} already exists.")


def _create_node(actor: Any, provider: Provider, building: Building, name: str, cleaned_gpus: list[dict[str, Any]],
                 gpu_floor: int, capacity: float, windows: list[dict[str, Any]]) -> tuple[Node, str]:
    with transaction.atomic():
        if Node.objects.filter(name=name).exists() or Link.objects.filter(name=f"access-{name}").exists():
            fail("name", f"A node named {name!r} already exists.")
        switch = _building_switch(building)
        link = Link.objects.create(
            name=f"access-{name}", kind=Link.Kind.ACCESS, upper=switch, capacity_bytes_per_s=capacity
        )
        token = new_agent_token()
        node = Node(name=name, provider=provider, building=building, access_link=link, gpu_floor=gpu_floor)
        node.set_agent_token(token)
        node.save()
        Gpu.objects.bulk_create([Gpu(node=node, **gpu) for gpu in cleaned_gpus])
        LendingWindow.objects.bulk_create([LendingWindow(node=node, **window) for window in windows])
        audit(actor, "node.register", node, gpus=len(cleaned_gpus), provider=provider.slug)
    return node, token


def update_node(node: Node, actor: Any, **changes: Any) -> Node:
    """Change ``name``, ``gpu_floor``, ``access_link_bytes_per_s`` or ``owner_use_policy`` (``ignore``,
    ``notify``, ``reclaim``: design §1 "Owner activity and MIG"); the others are agent-reported."""
    _require_node_manager(actor, node)
    unknown = set(changes) - {"name", "gpu_floor", "access_link_bytes_per_s", "owner_use_policy"}
    if unknown:
        fail(sorted(unknown)[0], "This field cannot be changed here.")
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        fields: list[str] = []
        if "name" in changes:
            name = text("name", changes["name"], max_length=100, required=True, pattern=NAME_RE)
            if name != node.name:
                if Node.objects.filter(name=name).exclude(pk=node.pk).exists():
                    fail("name", f"A node named {name!r} already exists.")
                node.name = name
                fields.append("name")
                if node.access_link is not None:
                    try:
                        with transaction.atomic():
                            Link.objects.filter(pk=node.access_link_id).update(name=f"access-{name}")
                    except IntegrityError:  # a concurrent registration took the name first
                        fail("name", f"A node named {name!r} already exists.")
        if "gpu_floor" in changes:
            node.gpu_floor = integer("gpu_floor", changes["gpu_floor"], minimum=0, maximum=node.gpus.count())
            fields.append("gpu_floor")
        if "owner_use_policy" in changes:
            policy = changes["owner_use_policy"]
            if policy not in OwnerUsePolicy.values:
                fail("owner_use_policy", f"One of {', '.join(OwnerUsePolicy.values)}.")
            node.owner_use_policy = policy
            fields.append("owner_use_policy")
        if "access_link_bytes_per_s" in changes:
            capacity = number("access_link_bytes_per_s", changes["access_link_bytes_per_s"], minimum=1.0,
                              maximum=MAX_LINK_BYTES_PER_S)
            if node.access_link_id is None:
                fail("access_link_bytes_per_s", "This node has no access link.")
            Link.objects.filter(pk=node.access_link_id).update(capacity_bytes_per_s=capacity)
        if fields:
            try:
                with transaction.atomic():
                    node.save(update_fields=fields)
            except IntegrityError:  # a concurrent rename or registration took the name first
                fail("name", f"A node named {node.name!r} already exists.")
        audit(actor, "node.update", node, changed=sorted(changes))
    node.refresh_from_db()
    return node


def set_lending_windows(node: Node, actor: Any, windows: Iterable[Mapping[str, Any]]) -> list[LendingWindow]:
    """Replace all of the node's lending windows at once ([] = always lent)."""
    _require_node_manager(actor, node)
    cleaned = _clean_windows(windows)
    with transaction.atomic():
        Node.objects.select_for_update().filter(pk=node.pk).first()
        node.lending_windows.all().delete()
        created = LendingWindow.objects.bulk_create([LendingWindow(node=node, **window) for window in cleaned])
        audit(actor, "node.lending_windows", node, windows=len(created))
    return list(node.lending_windows.all())


def rotate_agent_token(node: Node, actor: Any) -> str:
    """Issue a new agent token; the previous one stops working at once. Returns the raw token (shown once)."""
    _require_node_manager(actor, node)
    token = new_agent_token()
    with transaction.atomic():
        node.set_agent_token(token)
        Node.objects.filter(pk=node.pk).update(
            agent_token_hash=node.agent_token_hash, agent_token_prefix=node.agent_token_prefix,
            agent_token_revoked=False,
        )
        audit(actor, "node.rotate_token", node, prefix=node.agent_token_prefix)
    return token


def revoke_agent_token(node: Node, actor: Any) -> None:
    """No agent token works for this node until the next rotation."""
    _require_node_manager(actor, node)
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(agent_token_revoked=True)
        node.agent_token_revoked = True
        audit(actor, "node.revoke_token", node)


def node_for_agent_token(raw_token: str) -> Node | None:
    """The node an agent token belongs to (None if unknown or revoked). Constant-time on the digest."""
    if not isinstance(raw_token, str) or not raw_token:
        return None
    node = Node.objects.filter(agent_token_hash=hash_agent_token(raw_token)).first()
    if node is None or not node.check_agent_token(raw_token):
        return None
    return node


def lend_again(node: Node, actor: Any) -> Node:
    """reclaimed → offline (until its agent says hello); clears the kill-switch (design §1)."""
    _require_node_manager(actor, node)
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        node_lifecycle.lend_again(node)
        audit(actor, "node.lend_again", node)
        outbox.enqueue(outbox.Task.NODE_LENT_AGAIN, node.pk)
    return node


def retire_node(node: Node, actor: Any) -> Node:
    _require_node_manager(actor, node)
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        node_lifecycle.retire(node)
        audit(actor, "node.retire", node)
    return node


__all__ = [
    "ACCESS_LINK_DEFAULT_BYTES_PER_S",
    "ValidationError",
    "lend_again",
    "node_for_agent_token",
    "register_node",
    "retire_node",
    "revoke_agent_token",
    "rotate_agent_token",
    "set_lending_windows",
    "update_node",
]
