"""A request model's refusal (pydantic's ValidationError) in plain words, the same at every
edge that reports one: "must be at least 1", not "Input should be greater than or equal to 1".
"""
from __future__ import annotations

import re
from typing import Any, Mapping

_PLAIN: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"Value error, (.*)", r"\1"),
    (r"Input should be greater than or equal to (.+)", r"must be at least \1"),
    (r"Input should be greater than (.+)", r"must be more than \1"),
    (r"Input should be less than or equal to (.+)", r"must be at most \1"),
    (r"Input should be less than (.+)", r"must be less than \1"),
    (r"Input should be a valid integer.*", "must be a whole number"),
    (r"Input should be a valid number.*", "must be a number"),
    (r"Input should be a valid boolean.*", "must be true or false"),
    (r"Input should be a valid string", "must be a string"),
    (r"String should have at least (\d+) characters?", r"must be at least \1 characters long"),
    (r"String should have at most (\d+) characters?", r"must be at most \1 characters long"),
    (r"Field required", "is required"),
    (r"Extra inputs are not permitted", "unknown field"),
    (r"Input should be (.+)", r"must be \1"),
))


def plain_message(err: Mapping[str, Any]) -> str:
    """One entry of `ValidationError.errors()`: what is wrong with its value, in plain words."""
    msg = str(err.get("msg", "invalid value"))
    for pattern, replacement in _PLAIN:
        if pattern.fullmatch(msg):
            return pattern.sub(replacement, msg)
    return msg
