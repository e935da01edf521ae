"""Roles and object-level permissions (design §1 "Who may do what").

Roles, derived from membership (no separate role table):

- **provider member**: member of at least one ``Provider`` (lab); manages and reclaims only that lab's nodes;
- **researcher**: member of at least one ``ResearchGroup``; sees and cancels only that group's jobs;
- **admin**: ``is_staff``; sees and does everything.

Visibility decides 404 versus 403: an object a user cannot see answers 404 (its existence is not revealed);
an action on a visible object the user may not perform answers 403. Nodes and the campus are visible to every
signed-in user (the campus is shared and placements must be explainable); jobs are visible only to their
group's members and admins; reclaims to the node's lab, to the groups whose jobs they moved, and admins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet
from rest_framework import permissions

from portal.core.models import Job, Migration, Node, Provider, ReclaimEvent, ResearchGroup

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    AnyUser = AbstractBaseUser | AnonymousUser


def is_admin(user: AnyUser | None) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def user_providers(user: AnyUser) -> QuerySet[Provider]:
    if is_admin(user):
        return Provider.objects.all()
    if not user.is_authenticated:
        return Provider.objects.none()
    return Provider.objects.filter(members=user)


def user_groups(user: AnyUser) -> QuerySet[ResearchGroup]:
    if is_admin(user):
        return ResearchGroup.objects.all()
    if not user.is_authenticated:
        return ResearchGroup.objects.none()
    return ResearchGroup.objects.filter(members=user)


def is_provider_member(user: AnyUser) -> bool:
    return user.is_authenticated and Provider.objects.filter(members=user).exists()


def is_researcher(user: AnyUser) -> bool:
    return user.is_authenticated and ResearchGroup.objects.filter(members=user).exists()


def roles(user: AnyUser) -> list[str]:
    """The user's roles, for display and for the API's ``/api/me/``."""
    found = []
    if is_admin(user):
        found.append("admin")
    if is_provider_member(user):
        found.append("provider")
    if is_researcher(user):
        found.append("researcher")
    return found


# --- nodes ---------------------------------------------------------------------------------------------------


def visible_nodes(user: AnyUser) -> QuerySet[Node]:
    return Node.objects.all() if user.is_authenticated else Node.objects.none()


def can_manage_provider(user: AnyUser, provider: Provider) -> bool:
    """Register nodes for ``provider``."""
    return is_admin(user) or (user.is_authenticated and provider.members.filter(pk=user.pk).exists())


def can_manage_node(user: AnyUser, node: Node) -> bool:
    """Update, reclaim, kill-switch, lend again, rotate the token: the node's own lab or an admin."""
    return is_admin(user) or (user.is_authenticated and node.provider.members.filter(pk=user.pk).exists())


# --- jobs ----------------------------------------------------------------------------------------------------


def visible_jobs(user: AnyUser) -> QuerySet[Job]:
    if is_admin(user):
        return Job.objects.all()
    if not user.is_authenticated:
        return Job.objects.none()
    return Job.objects.filter(group__in=ResearchGroup.objects.filter(members=user))


def can_submit_to_group(user: AnyUser, group: ResearchGroup) -> bool:
    return is_admin(user) or (user.is_authenticated and group.members.filter(pk=user.pk).exists())


def can_cancel_job(user: AnyUser, job: Job) -> bool:
    return is_admin(user) or (user.is_authenticated and job.group.members.filter(pk=user.pk).exists())


# --- reclaims ------------------------------------------------------------------------------------------------


def visible_reclaims(user: AnyUser) -> QuerySet[ReclaimEvent]:
    if is_admin(user):
        return ReclaimEvent.objects.all()
    if not user.is_authenticated:
        return ReclaimEvent.objects.none()
    # Two id sets, not one OR across both join paths: PostgreSQL planned and ran that nine-table join in ~7 ms
    # for every provider's list (docs/design.md §10); each set alone is a two-join index lookup.
    by_lab = ReclaimEvent.objects.filter(node__provider__members=user).values("pk")
    by_group = Migration.objects.filter(job__group__members=user).values("reclaim_id")
    return ReclaimEvent.objects.filter(Q(pk__in=by_lab) | Q(pk__in=by_group))


# --- DRF permission classes ------------------------------------------------------------------------------------


class CanManageNode(permissions.BasePermission):
    """Object-level: writes on a node need its lab or an admin (reads are open to signed-in users)."""

    message = "Only members of the node's provider lab (or an admin) may do this."

    def has_object_permission(self, request: Any, view: Any, obj: Node) -> bool:
        if request.method in permissions.SAFE_METHODS and getattr(view, "action", None) not in view.manage_actions:
            return True
        return can_manage_node(request.user, obj)


class CanCancelJob(permissions.BasePermission):
    message = "Only members of the job's research group (or an admin) may do this."

    def has_object_permission(self, request: Any, view: Any, obj: Job) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return can_cancel_job(request.user, obj)

