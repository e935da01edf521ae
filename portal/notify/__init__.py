"""Notifications where people look: mail and signed webhooks, per-user preferences, a digest, a delivery log
(docs/design.md §12). Reads the events of ``portal.core.events`` (design §9.12) and adds one delivery to
``events.DELIVERIES``."""
