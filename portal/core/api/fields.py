"""Strict field types: a wrong JSON type is a 400 naming the field, never silently coerced."""

from __future__ import annotations

import math
from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A string, and only a string (DRF's CharField would turn 123 or 1.5 into text)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class FiniteFloatField(serializers.FloatField):
    """A finite number; booleans, NaN and infinities are refused."""

    default_error_messages = {"not_finite": "A finite number is required."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("not_finite")
        return value


class StrictIntegerField(serializers.IntegerField):
    """An integer; booleans and fractional numbers are refused."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(data)
