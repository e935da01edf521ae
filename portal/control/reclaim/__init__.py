"""Reclaims, planned then applied (design §9.2), and the reclaim, migration and transfer lifecycles (§9.6)."""
