"""TOML text of recipe data (dicts of strings, numbers, booleans, lists and tables), every string
escaped so `tomllib` reads back exactly the data: the `toml` package wrote `\\x` and DEL
unescaped (a recipe that did not parse, or a path that changed). Leaf module."""

import math
import re

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def quote(text: str) -> str:
    """A TOML basic string: backslashes, quotes and control characters escaped."""
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif ord(char) < 32 or ord(char) == 127:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else quote(name)


def value(item) -> str:
    """A TOML value; a table inside a list is an inline table."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if math.isnan(item):
            return "nan"
        return repr(item) if math.isfinite(item) else ("inf" if item > 0 else "-inf")
    if isinstance(item, str):
        return quote(item)
    if isinstance(item, (list, tuple)):
        return "[ " + ", ".join(value(v) for v in item) + ",]" if item else "[]"
    if isinstance(item, dict):
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + " }"
    raise TypeError(f"no TOML value for {type(item).__name__}")


def table(name: str, data: dict, array: bool = False) -> str:
    """`[name]` (`array`: `[[name]]`) with its keys, then its sub-tables as `[name.sub]` and
    arrays of tables as `[[name.sub]]`, as the `toml` package laid them out."""
    lines = [f"[[{name}]]" if array else f"[{name}]"]
    nested = []
    for k, v in data.items():
        if isinstance(v, dict):
            nested.append(table(f"{name}.{key(k)}", v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            nested += [table(f"{name}.{key(k)}", x, array=True) for x in v]
        else:
            lines.append(f"{key(k)} = {value(v)}")
    return "\n".join([*lines, ""]) + "".join(f"\n{t}" for t in nested)
