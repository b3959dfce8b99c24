"""The values the ``pipeline`` command's options take: each parser turns the text typed into the value
the library expects, or raises ``argparse.ArgumentTypeError`` with what was expected, which argparse
shows beside the option's name."""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any, Callable

from .write.part import Part
from .write.source import MIN_SHARD_BYTES

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256000000, ``"1GiB"`` -> 1073741824, ``"4096"`` -> 4096."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MB, 1GiB, 4096)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive(text: str) -> int:
    return _whole(text, 1)


def percent(text: str) -> int:
    """A whole number from 1 to 100 (a JPEG quality)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 100")
    return value


def count(text: str) -> int:
    """A number of things that may be none (``inspect --samples 0``)."""
    return _whole(text, 0)


def finite_number(positive: bool) -> Callable[[str], float]:
    """A finite number, > 0 where ``positive`` (seconds to measure, a memory budget), else >= 0 (a
    simulated step)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number {'>' if positive else '>='} 0")
        return value
    return parse


def shard_bytes(text: str) -> int | None:
    """A size (``256MiB``), or ``none`` for no size limit (``shard_bytes=None``)."""
    if text.strip().lower() == "none":
        return None
    value = parse_size(text)
    if value < MIN_SHARD_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is smaller than a shard can be ({MIN_SHARD_BYTES} bytes); "
                                         f"--shard-bytes none for no size limit")
    return value


def part(text: str) -> Part:
    try:
        return Part.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pack(text: str) -> int | str:
    """A whole number >= 1, or ``auto`` (in any case, as ``none`` of ``--shard-bytes``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}: give samples per record (1 or more), or auto") from None


def validation(text: str) -> float | int:
    """``0.1`` (a fraction) or ``5000`` (samples)."""
    try:
        return int(text) if text.isdigit() else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a fraction or a number of samples: {text!r}") from None


def pair(form: str, empty: bool = False) -> Callable[[str], tuple[str, str]]:
    """A parser of ``NAME=VALUE`` arguments whose errors show ``form`` (e.g. ``NAME=PATH``); the
    value may be empty only where ``empty`` says so (a fill of text: ``--fill caption=``)."""
    def parse(text: str) -> tuple[str, str]:
        name, sep, value = text.partition("=")
        if not sep or not name or not (value or empty):
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}")
        return name, value
    return parse


def named(pairs: list[tuple[str, Any]], option: str) -> dict[str, Any]:
    """The ``NAME=VALUE`` pairs of a repeatable option as a mapping; a name given twice is an error
    (the last would silently win, and one input be dropped)."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise SystemExit(f"error: {option} {name}= is given twice ({out[name]!r} and {value!r}): give each name once")
        out[name] = value
    return out


def image_field(text: str) -> tuple[str, int]:
    """``FIELD=SIZE`` of ``tune --images``."""
    field, size = pair("FIELD=SIZE")(text)
    return field, positive(size)


def fill(text: str) -> tuple[str, Any]:
    """``COL=VALUE``; the value stays text: the column's type says what it becomes (a number for
    a numeric column, the text as typed for a text one)."""
    return pair("COL=VALUE", empty=True)(text)


def names(text: str) -> list[str]:
    """``A,B``: names, in order, none empty."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
    return parts


def json_or_text(text: str) -> Any:
    """A value typed on the command line: JSON where it is (``0``, ``-1.5``, ``null``, ``"7"``),
    else the text as typed (``--fill caption=none`` is the text ``none``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def counts(least: int) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            counts = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if any(n < least for n in counts):
            raise argparse.ArgumentTypeError(f"expected numbers >= {least}, got {text!r}")
        return counts

    return parse


#: A Python argument followed by its option, as the library's messages give them: ``overwrite=True (--overwrite)``.
_ARGUMENT_THEN_OPTION = re.compile(r"\b(\w+=\w+) \((--[\w-]+(?: \w+)?)\)")


def options_first(message: str) -> str:
    """A library message as the command line says it: ``--overwrite (overwrite=True in Python)``
    where the library says ``overwrite=True (--overwrite)``."""
    return _ARGUMENT_THEN_OPTION.sub(r"\2 (\1 in Python)", message)
