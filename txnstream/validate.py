"""Checks an entry point runs on the values it was given, before it takes anything.

DESIGN.md section 10: every request, record and option is validated before anything is
taken (a TxnID from the pool, a partition registered, a transaction opened). Pure
functions: each returns the value as the caller should use it, or raises
:class:`~txnstream.errors.ConfigError` (a ``ValueError`` too) whose message names the
argument or option at fault, the value it got and what it needs.

``name`` is how the caller's user knows the thing: an argument (``"timeout_s"``), an
element (``"partitions[3]"``) or a Spark option (``"option 'maxRecordsPerTrigger'"``).
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from typing import TypeGuard

from txnstream.errors import ConfigError
from txnstream.types import TxnID

__all__ = ["MIN_TIMEOUT_S", "MAX_PARTITION", "MAX_REQUEST_TIMEOUT_S", "MAX_LONG",
           "timeout_seconds", "seconds_text", "whole_number", "positive_int",
           "partition_index", "whole_number_text", "txn_id", "flag", "nonempty_text"]

MIN_TIMEOUT_S = 0.001
"""The coordinator counts a transaction's timeout in whole milliseconds: anything shorter
would reach it as 0 ms, which it reads as "none given" (its default, 60 s)."""
MAX_PARTITION = 2**31 - 1
"""Kafka partitions are int32."""
MAX_LONG = 2**63 - 1
"""A Java long: offsets, and Spark's row limits."""
MAX_REQUEST_TIMEOUT_S = 24 * 3600.0
"""Cap of a request's deadline (``end_group``, ``abort_transaction``): a retried request
waiting longer than a day is a mistake, and its absolute deadline must fit the wire."""

_SHOW_MAX = 80
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_WHOLE = re.compile(r"[+-]?[0-9]{1,30}")
_TXN_TEXT = re.compile(r"\(\s*([0-9]{1,20})\s*,\s*([0-9]{1,20})\s*\)"
                       r"|([0-9]{1,20}):([0-9]{1,20})")
"""``TxnID``'s text forms (``TxnID.parse``), ASCII digits only, each at most 20 of them."""


def _show(value: object) -> str:
    """``repr`` of a value for an error message, cut short if long (user text)."""
    text = repr(value)
    return text if len(text) <= _SHOW_MAX else text[:_SHOW_MAX - 3] + "..."


def _is_real(value: object) -> TypeGuard[numbers.Real]:
    """An int or float (numpy's too), never a bool: ``True`` is not a number of anything."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_seconds(seconds: float, shown: str, name: str, maximum: float | None,
                   cap: str | None, minimum: float) -> float:
    if not math.isfinite(seconds):
        raise ConfigError(f"{name} must be a finite number of seconds, got {shown}")
    if seconds <= 0:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {shown}")
    if seconds < minimum:
        raise ConfigError(f"{name}={shown} is under the minimum {minimum:g} s (the "
                          "coordinator counts whole milliseconds)")
    if maximum is not None and seconds > maximum:
        raise ConfigError(f"{name}={shown} is over the maximum {maximum:g} s"
                          + (f" ({cap})" if cap else ""))
    return seconds


def timeout_seconds(value: object, name: str, *, maximum: float | None,
                    cap: str | None = None, minimum: float = MIN_TIMEOUT_S) -> float:
    """``value`` as a float number of seconds in ``[minimum, maximum]``.

    Refused: a bool, anything not a real number, NaN, infinities, zero and less, less
    than ``minimum`` (1 ms, the coordinator's unit), more than ``maximum`` (None: no
    cap); ``cap`` names where the maximum comes from, e.g.
    ``"timeout_s=7200 is over the maximum 3600 s (Config.max_txn_timeout_s)"``.
    """
    if not _is_real(value):
        raise ConfigError(f"{name} must be a number of seconds, got {_show(value)}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        seconds = math.inf
    return _check_seconds(seconds, _show(value), name, maximum, cap, minimum)


def seconds_text(text: object, name: str, *, maximum: float | None, cap: str | None = None,
                 minimum: float = MIN_TIMEOUT_S) -> float:
    """A number of seconds written as text (an option): decimal notation only.

    ``"nan"``, ``"inf"``, ``"1_0"`` and non-ASCII digits are refused as not a number;
    then the checks of :func:`timeout_seconds`.
    """
    shown = _show(text)
    if not isinstance(text, str) or len(text) > _SHOW_MAX \
            or not _DECIMAL.fullmatch(text.strip()):
        raise ConfigError(f"{name} must be a number of seconds, got {shown}")
    return _check_seconds(float(text), shown, name, maximum, cap, minimum)


def whole_number(value: object, name: str, *, minimum: int = 0,
                 maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (no maximum if None).

    An int, or anything with ``__index__`` (numpy's ints); never a bool or a float.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a whole number (an int, not a bool), "
                          f"got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be a whole number (an int), got {_show(value)}") \
            from None
    if number < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name}={number} is over the maximum {maximum}")
    return number


def positive_int(value: object, name: str, maximum: int | None = None) -> int:
    """``value`` as an int >= 1 (and <= ``maximum``); see :func:`whole_number`."""
    return whole_number(value, name, minimum=1, maximum=maximum)


def partition_index(value: object, name: str) -> int:
    """``value`` as a Kafka partition index: an int (not a bool) in ``0 .. 2**31 - 1``.

    Whether the topic has that partition is the caller's check.
    """
    return whole_number(value, name, minimum=0, maximum=MAX_PARTITION)


def whole_number_text(text: object, name: str, *, minimum: int = 1,
                      maximum: int = MAX_LONG) -> int:
    """A whole number written as text (an option), in ``[minimum, maximum]``.

    ASCII digits with an optional sign only: ``"1e3"``, ``"1_000"``, ``"nan"`` are
    refused; the message reads e.g. ``option 'maxRecordsPerTrigger' must be a whole
    number >= 1, got 'nan'``.
    """
    if not isinstance(text, str) or not _WHOLE.fullmatch(text.strip()) \
            or not minimum <= int(text) <= maximum:
        rule = f"a whole number >= {minimum}" if maximum == MAX_LONG \
            else f"a whole number in {minimum}..{maximum}"
        raise ConfigError(f"{name} must be {rule}, got {_show(text)}")
    return int(text)


def txn_id(value: object, name: str) -> TxnID:
    """A ``TxnID``, or its text form (``"(0,42)"``, as ``str(txn.id)`` gives) parsed."""
    if isinstance(value, TxnID):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a TxnID or its text form like '(0,42)', "
                          f"got {_show(value)}")
    m = _TXN_TEXT.fullmatch(value.strip())
    if m is None:
        raise ConfigError(f"{name}={_show(value)} is not a TxnID: expected its text form "
                          "'(most,least)', e.g. '(0,42)'")
    most, least = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3),
                                                                            m.group(4))
    try:
        return TxnID(int(most), int(least))
    except ValueError as exc:  # out of range: names which half
        raise ConfigError(f"{name}={_show(value)} is not a TxnID: {exc}") from None


def flag(value: object, name: str) -> bool:
    """``value`` if it is a bool: a string such as ``"false"`` would read as true."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {_show(value)}")
    return value


def nonempty_text(value: object, name: str) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string, got {_show(value)}")
    return value


def consumer_options(initial_position: object, subscription: object,
                     kafka: dict[str, object]) -> None:
    """A consumer's own options (``client.subscribe``); librdkafka checks the rest."""
    if initial_position not in ("earliest", "latest"):
        raise ConfigError(f"initial_position must be 'earliest' or 'latest', "
                          f"got {initial_position!r}")
    if not subscription:
        raise ConfigError("subscription (the consumer group) must not be empty")
    if "max_buffered_bytes" in kafka:
        raise ConfigError("max_buffered_bytes was removed: a consumer holds nothing back "
                          "any more (it pauses a partition at the first record not yet "
                          "committed), so memory is one fetch; drop the argument, or bound "
                          "a fetch with librdkafka's 'fetch.max.bytes'")
