"""Strict field types: a wrong JSON type is a 400 naming the field, never silently coerced."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

TIME_OF_DAY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$"
_TIME_OF_DAY = re.compile(TIME_OF_DAY_PATTERN)


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


@extend_schema_field({"type": "string", "pattern": TIME_OF_DAY_PATTERN, "example": "08:00:00",
                      "description": "A wall-clock time of day, HH:MM or HH:MM:SS (24-hour clock, no timezone)."})
class TimeOfDayField(serializers.TimeField):
    """A wall-clock time of day as ``HH:MM`` or ``HH:MM:SS``, answered as ``HH:MM:SS``. The schema cannot say
    ``format: time`` (RFC 3339 times carry an offset; a lending window is local time with none), so the field
    accepts exactly its documented pattern: no offsets, fractions or single-digit hours."""

    default_error_messages = {"invalid": "Use HH:MM or HH:MM:SS (24-hour clock, no timezone)."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(format="%H:%M:%S", input_formats=["%H:%M:%S", "%H:%M"], **kwargs)

    def to_internal_value(self, value: Any) -> dt.time:
        if not isinstance(value, str) or not _TIME_OF_DAY.match(value):
            self.fail("invalid")
        return super().to_internal_value(value)
