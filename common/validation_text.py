"""A request model's refusal (pydantic's ValidationError) in plain words, the same at every
edge that reports one: "must be at least 1", not "Input should be greater than or equal to 1".
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

_PLAIN: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.DOTALL), r) for p, r in (
    (r"Value error, (.*)", r"\1"),
    (r"Input should be a valid (?:tuple|list|array).*", "must be a list"),
    (r"Input should be a valid dictionary.*", "must be an object"),
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


_KINDS = {"str": "a string", "int": "a whole number", "bool": "true/false", "float": "a number"}


def plain_issues(errors: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """`ValidationError.errors()` as (where, "what is wrong (got VALUE)") pairs, `where` the
    dotted location ("" for the whole body). A value that fits no branch of a union (a topic
    config value: string, number or boolean) is one pair, "must be a string, a whole number,
    true/false or a number", not one per branch."""
    lines: list[tuple[tuple[Any, ...], list[str], str]] = []   # (location, union kinds, message)
    unions: dict[tuple[Any, ...], list[str]] = {}
    for err in errors:
        loc = tuple(err.get("loc", ()))
        got = "" if err.get("type") in ("missing", "extra_forbidden") or "input" not in err \
            else f" (got {err['input']!r})"
        if len(loc) > 1 and loc[-1] in _KINDS:
            if loc[:-1] not in unions:
                unions[loc[:-1]] = []
                lines.append((loc[:-1], unions[loc[:-1]], got))
            unions[loc[:-1]].append(_KINDS[loc[-1]])
            continue
        lines.append((loc, [], plain_message(err) + got))
    out = []
    for loc, kinds, text in lines:
        if kinds:
            text = "must be " + (" or ".join(kinds) if len(kinds) < 3
                                 else ", ".join(kinds[:-1]) + " or " + kinds[-1]) + text
        out.append((".".join(str(part) for part in loc), text))
    return out
