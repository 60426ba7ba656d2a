"""Parsing of the size and rate lists the bench commands take ("8k,16k,128K", "0,0.6,0.9", "1,2,4")."""

from __future__ import annotations

import re

_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_MULT = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_token_count(text: str) -> int:
    """One token count: a plain integer, or with a binary suffix as the seed writes them (8k = 8192,
    128K = 131072, 1m = 1048576). Raises ValueError with the offending text."""
    m = _TOKENS.match(text)
    if not m:
        raise ValueError(f"not a token count: {text!r} (use e.g. 1000, 8k, 128K)")
    value = float(m.group(1)) * _MULT[m.group(2).lower()]
    if value != int(value) or value <= 0:
        raise ValueError(f"not a positive whole token count: {text!r}")
    return int(value)


def _items(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in items):
        raise ValueError(f"empty entry in {what} list {text!r}")
    return items


def parse_token_counts(text: str) -> list[int]:
    """A comma-separated list of token counts ("8k,16k,32k")."""
    return [parse_token_count(part) for part in _items(text, "length")]


def parse_positive_ints(text: str, what: str = "integer") -> list[int]:
    """A comma-separated list of positive integers ("1,2,4,8")."""
    out = []
    for part in _items(text, what):
        if not part.isdigit() or int(part) <= 0:
            raise ValueError(f"not a positive {what}: {part!r} in {text!r}")
        out.append(int(part))
    return out


def parse_rates(text: str) -> list[float]:
    """A comma-separated list of fractions in [0, 1) ("0,0.6,0.9"); percentages like "60%" are accepted."""
    out = []
    for part in _items(text, "hit-rate"):
        try:
            value = float(part[:-1]) / 100 if part.endswith("%") else float(part)
        except ValueError:
            raise ValueError(f"not a hit rate: {part!r} in {text!r}") from None
        if not 0.0 <= value < 1.0:
            raise ValueError(f"hit rate {part!r} outside [0, 1): a request always has at least one uncached token")
        out.append(value)
    return out


def format_tokens(n: int) -> str:
    """8192 -> '8K', 1000 -> '1000' (the seed's axis labels)."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // (1024 * 1024)}M" if n % (1024 * 1024) == 0 else f"{n // 1024}K"
    return str(n)
