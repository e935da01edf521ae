"""Campus sign-in: OpenID Connect beside local accounts, claims mapped to labs, groups and staff by admin-editable
rules (docs/design.md §20)."""
