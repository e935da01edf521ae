"""The what-if report (design §7 "The what-if report"): export the portal's history as a campus trace, upload one,
and compare the simulator's policies on it from the portal."""

from __future__ import annotations

from django.apps import AppConfig


class WhatifConfig(AppConfig):
    name = "portal.whatif"
    label = "whatif"
    verbose_name = "What-if evaluations"
    default_auto_field = "django.db.models.BigAutoField"
