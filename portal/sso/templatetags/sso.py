"""``{% sso_sign_in %}``: the "Sign in with <campus>" button of the login page, shown only while campus sign-in is
configured (docs/design.md §20)."""

from __future__ import annotations

from typing import Any

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("sso/sign_in.html", takes_context=True)
def sso_sign_in(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    next_url = context.get("next") or (request.GET.get("next", "") if request is not None else "")
    return {"enabled": bool(getattr(settings, "RECLAIMNET_OIDC_ENABLED", False)),
            "campus_name": getattr(settings, "RECLAIMNET_OIDC_CAMPUS_NAME", ""), "next": next_url}
