"""The bounds a request body's JSON must keep before it is parsed: nesting depth and number-literal length.

Python's parser turns 100k-deep nesting into a RecursionError and a 5000-digit integer into a ValueError; the
router refuses both with a 400 first. Both checks are C-speed passes over the bytes, so the router's whole-body
parse (`router.request_checks.parse_json_body`) and its incremental chat parse (`routing.chat_prefix`, which
checks only the bytes it parses) apply the same rule.
"""

from __future__ import annotations

import re

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
"""bytes.translate table: digits become "0", every other byte a space (a digit run becomes a run of "0")."""
_BRACKETS = bytes(91 if i in b"[{" else 93 if i in b"]}" else i for i in range(256))
_NOT_BRACKETS = bytes(i for i in range(256) if i not in b"[]{}")


def nested_deeper_than(raw: bytes, limit: int) -> bool:
    """Whether the arrays and objects of a JSON text nest deeper than `limit`.

    The text is reduced to its brackets (one C-speed pass); each `bytes.replace` of "[]" then removes every
    innermost level, so the levels removed before nothing is left are the depth, found in at most `limit` passes
    over the (short) bracket string. Brackets inside strings are counted as structure, which can only make a
    text look deeper or unbalanced; what is really deeper than the parser allows fails to parse anyway. Closers
    without an opener (a text cut out of a larger one) are left over and count for nothing."""
    br = raw.translate(_BRACKETS, _NOT_BRACKETS)
    if len(br) <= limit:  # fewer openers than the limit
        return False
    for _ in range(limit):
        shorter = br.replace(b"[]", b"")
        if len(shorter) == len(br):
            return False
        br = shorter
    return b"[]" in br


def limit_violation(raw: bytes, max_depth: int, max_number_chars: int) -> str | None:
    """Why the JSON text `raw` breaks a bound (nesting deeper than `max_depth`, a number literal longer than
    `max_number_chars` characters), or None. The string-aware number check, a regular expression, runs only when
    some digit run is too long."""
    if nested_deeper_than(raw, max_depth):
        return f"the JSON body is nested deeper than {max_depth} levels"
    run = b"0" * (max_number_chars + 1)
    if run in raw.translate(_DIGITS) and run in _STRING.sub(b'""', raw).translate(_DIGITS):
        return f"the JSON body has a number longer than {max_number_chars} characters"
    return None
