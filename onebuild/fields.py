"""Typed reading of decoded JSON (IR descriptions, .tvn LAYERS/META): every accessor checks the
JSON type and the range of one field and fails with a one-line FormatError naming the file and
the field's path (`graphs[0].nodes[3].attrs`), so loaders validate with one call per field
instead of scattered `isinstance` checks. Leaf module: it imports only the error types.
"""

import math
from collections.abc import Callable, Iterable
from typing import Any

from .errors import FormatError

MAX_DIM = (1 << 31) - 1


class Fields:
    """Checks for the fields of one file; `fail(message)` builds the FormatError."""

    def __init__(self, fail: Callable[[str], FormatError]):
        self.fail = fail

    def error(self, path: str, message: str) -> FormatError:
        return self.fail(f"{path}: {message}")

    def require(self, condition: bool, path: str, message: str) -> None:
        if not condition:
            raise self.error(path, message)

    # -- JSON types ----------------------------------------------------------------------------
    def obj(
        self, value: Any, path: str, required: Iterable[str] = (), optional: Iterable[str] = ()
    ) -> dict:
        """A JSON object with every `required` key; with `required` or `optional` given, no
        keys besides those."""
        required, optional = set(required), set(optional)
        self.require(isinstance(value, dict), path, f"expected an object, found {_kind(value)}")
        missing = sorted(required - set(value))
        self.require(not missing, path, f"missing key(s) {', '.join(missing)}")
        if required or optional:
            extra = sorted(set(value) - required - optional)
            self.require(not extra, path, f"unknown key(s) {', '.join(map(repr, extra))}")
        return value

    def array(self, value: Any, path: str, min_len: int = 0, max_len: int = 1 << 24) -> list:
        self.require(isinstance(value, list), path, f"expected a list, found {_kind(value)}")
        self.require(
            min_len <= len(value) <= max_len,
            path,
            f"has {len(value)} entries (needs {min_len}..{max_len})",
        )
        return value

    def text(self, value: Any, path: str, empty: bool = False, max_len: int = 1 << 16) -> str:
        self.require(isinstance(value, str), path, f"expected a string, found {_kind(value)}")
        self.require(empty or value != "", path, "is empty")
        self.require(len(value) <= max_len, path, f"is {len(value)} characters long")
        return value

    def integer(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
        """An integer (not a bool, not a float) in [lo, hi]."""
        ok = isinstance(value, int) and not isinstance(value, bool)
        self.require(ok, path, f"expected an integer, found {_kind(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.error(path, f"{value} is out of range [{lo}, {hi}]")
        return value

    def number(self, value: Any, path: str, positive: bool = False, finite: bool = True) -> float:
        """A number (JSON int or float, not a bool), finite unless told, > 0 if `positive`."""
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        self.require(ok, path, f"expected a number, found {_kind(value)}")
        self.require(not finite or math.isfinite(value), path, f"{value} is not finite")
        self.require(not positive or value > 0, path, f"{value} is not positive")
        return float(value)

    def choice(self, value: Any, path: str, choices: Iterable) -> Any:
        choices = list(choices)
        ok = isinstance(value, str | int) and not isinstance(value, bool) and value in choices
        self.require(ok, path, f"{_short(value)} is not one of {', '.join(map(str, choices))}")
        return value

    # -- composites ----------------------------------------------------------------------------
    def integers(
        self, value: Any, path: str, lo: int | None = None, hi: int | None = None, **length
    ) -> list[int]:
        items = self.array(value, path, **length)
        return [self.integer(v, f"{path}[{i}]", lo, hi) for i, v in enumerate(items)]

    def shape(
        self, value: Any, path: str, max_rank: int = 16, max_elements: int = 1 << 40
    ) -> tuple[int, ...]:
        """Dims in [0, 2^31), at most `max_rank` of them, whose product (computed exactly, it
        cannot overflow) is at most `max_elements`."""
        dims = self.integers(value, path, 0, MAX_DIM, max_len=max_rank)
        self.require(
            math.prod(dims) <= max_elements,
            path,
            f"{dims} holds {math.prod(dims)} elements (at most {max_elements})",
        )
        return tuple(dims)

    def unique(self, names: Iterable[str], path: str) -> None:
        seen: set[str] = set()
        for name in names:
            self.require(name not in seen, path, f"name '{name}' is defined twice")
            seen.add(name)


def _kind(value: Any) -> str:
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kind.get(type(value), f"{type(value).__name__} {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
