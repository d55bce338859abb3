"""What every command's parser shares: argument types and the help formatter."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = [
    "RAW",
    "Handler",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
]

#: Help text as written (the examples keep their lines).
RAW = argparse.RawDescriptionHelpFormatter
#: A command's code: the parsed arguments in, the exit code out.
Handler = Callable[[argparse.Namespace], int]


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value
