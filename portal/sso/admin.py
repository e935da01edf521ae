"""Django admin for campus sign-in (docs/design.md §20): the claim rules, editable and ordered; the campus
identities with the claims last received (what rules are written against); the memberships rules granted."""

from __future__ import annotations

from django.contrib import admin

from portal.sso.models import CampusIdentity, ClaimRule, RuleGrant


@admin.register(ClaimRule)
class ClaimRuleAdmin(admin.ModelAdmin):
    list_display = ["position", "claim", "match", "value", "ignore_case", "action", "provider", "research_group",
                    "enabled", "note"]
    list_display_links = ["claim"]
    list_editable = ["position", "enabled"]
    list_filter = ["action", "enabled", "match"]
    search_fields = ["claim", "value", "note"]
    ordering = ["position", "id"]
    fields = ["position", "enabled", "claim", "match", "value", "ignore_case", "action", "provider",
              "research_group", "note"]


@admin.register(CampusIdentity)
class CampusIdentityAdmin(admin.ModelAdmin):
    list_display = ["subject", "issuer", "user", "created_at", "last_login_at"]
    search_fields = ["subject", "user__username", "user__email"]
    readonly_fields = ["created_at", "last_login_at", "last_claims"]
    raw_id_fields = ["user"]


@admin.register(RuleGrant)
class RuleGrantAdmin(admin.ModelAdmin):
    list_display = ["user", "kind", "provider", "research_group", "granted_at"]
    list_filter = ["kind"]
    search_fields = ["user__username"]
    readonly_fields = ["user", "kind", "provider", "research_group", "granted_at"]

    def has_add_permission(self, request: object) -> bool:
        return False  # rows are written by sign-ins only
