"""Small validators shared by the services: each raises ``ValidationError({field: [message]})``."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def fail(field: str, message: str) -> None:
    raise ValidationError({field: [message]})


def fail_fields(errors: dict[str, str]) -> None:
    """Refuse several fields at once, one message each (nothing when ``errors`` is empty)."""
    if errors:
        raise ValidationError({field: [message] for field, message in errors.items()})


def number(field: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
           exclusive_minimum: bool = False) -> float:
    """A finite number within bounds (bools are not numbers here; Decimals from forms are)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        fail(field, "A number is required.")
    result = float(value)
    if not math.isfinite(result):
        fail(field, "Must be a finite number.")
    if minimum is not None:
        if exclusive_minimum and result <= minimum:
            fail(field, f"Must be greater than {minimum:g}.")
        if not exclusive_minimum and result < minimum:
            fail(field, f"Must be at least {minimum:g}.")
    if maximum is not None and result > maximum:
        fail(field, f"Must be at most {maximum:g}.")
    return result


def integer(field: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(field, "An integer is required.")
    if minimum is not None and value < minimum:
        fail(field, f"Must be at least {minimum}.")
    if maximum is not None and value > maximum:
        fail(field, f"Must be at most {maximum}.")
    return int(value)


def text(field: str, value: Any, *, max_length: int, required: bool = False, pattern: re.Pattern[str] | None = None
         ) -> str:
    if not isinstance(value, str):
        fail(field, "A string is required.")
    value = value.strip()
    if required and not value:
        fail(field, "This field may not be blank.")
    if len(value) > max_length:
        fail(field, f"Ensure this field has no more than {max_length} characters.")
    if pattern is not None and value and not pattern.match(value):
        fail(field, "Use letters, digits, '.', '_' and '-' only, starting with a letter or digit.")
    return value
