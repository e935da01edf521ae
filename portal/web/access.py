"""Who may see what on the pages (design §1 "Who may do what").

Every page looks objects up through these querysets, so an id edited into a URL or a form that the user may not
see is a 404, exactly as if it did not exist. Admins (staff) see everything.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from portal.core.models import Job, Node
from portal.core.permissions import is_admin, is_provider_member, is_researcher, user_groups, user_providers
from portal.core.permissions import visible_jobs as jobs_for

User = AbstractBaseUser | AnonymousUser

__all__ = [
    "hosted_jobs_for",
    "is_admin",
    "is_provider_member",
    "is_researcher",
    "jobs_for",
    "live_groups_for",
    "may_follow",
    "nodes_for",
    "page_roles",
    "user_groups",
    "user_providers",
]


class PageRoles:
    """The roles one request's user has, each read at most once per request and only when asked (design §10
    "CPU per request": a fragment that shows no navigation asks only its view's question)."""

    def __init__(self, user: User) -> None:
        self.user = user

    @cached_property
    def admin(self) -> bool:
        return is_admin(self.user)

    @cached_property
    def provider(self) -> bool:
        return is_provider_member(self.user)

    @cached_property
    def researcher(self) -> bool:
        return is_researcher(self.user)


def page_roles(request: Any) -> PageRoles:
    """The user's roles for this request, cached on the request: the view's check, the navigation and the
    page's own wording ask the same question, and each answer is a query."""
    cached = getattr(request, "_reclaimnet_roles", None)
    if cached is None:
        cached = request._reclaimnet_roles = PageRoles(request.user)
    return cached


def nodes_for(user: User) -> QuerySet[Node]:
    """Nodes the user may manage on the provider pages: their labs' nodes (admins: all).

    Stricter than the API's read visibility (every node is readable there): a researcher has no provider
    pages at all, and a lab never sees another lab's node page.
    """
    if is_admin(user):
        return Node.objects.all()
    return Node.objects.filter(provider__in=user_providers(user))


def hosted_jobs_for(user: User) -> QuerySet[Job]:
    """Jobs running right now on the user's labs' nodes."""
    return Job.objects.filter(placements__node__in=nodes_for(user), placements__ended_at__isnull=True)


def live_groups_for(user: User) -> list[str]:
    """The Channels groups a browser of this user joins when it connects (portal/control/link/publish.py names)."""
    if not user.is_authenticated:
        return []
    groups = [f"provider-{pk}" for pk in user_providers(user).values_list("pk", flat=True)]
    groups += [f"group-{pk}" for pk in user_groups(user).values_list("pk", flat=True)]
    if is_admin(user):
        groups.append("dashboard")
    return groups


def may_follow(user: User, group: str) -> bool:
    """Whether a browser of this user may join one object's group (``node-<id>`` or ``job-<id>``)."""
    kind, _, raw_id = group.partition("-")
    if not raw_id.isdigit():
        return False
    if kind == "node":
        return nodes_for(user).filter(pk=int(raw_id)).exists()
    if kind == "job":
        # A provider may follow the jobs its nodes host right now.
        return (
            jobs_for(user).filter(pk=int(raw_id)).exists() or hosted_jobs_for(user).filter(pk=int(raw_id)).exists()
        )
    return group in live_groups_for(user)
