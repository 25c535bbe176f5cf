"""Mask personal data in free text before it is written into a dataset.

Four kinds are recognised: e-mail addresses, payment card numbers, IPv4 addresses and
phone numbers. Each is replaced by a typed placeholder (``[EMAIL]``, ``[CARD]``,
``[IPV4]``, ``[PHONE]``) so a model still sees that *something* was there, and the
counts per kind feed the data report.

The kinds are applied in a fixed order whatever order the caller lists them in,
because the patterns overlap: an e-mail's local part may hold digits or an address,
and a grouped card number looks like several phone-number groups. So e-mails go
first, then cards, then IPv4 addresses, then phones.

Precision matters as much as recall: a dataset where every year, date, version or
order number became ``[PHONE]`` is damaged. Hence cards must pass the Luhn check,
IPv4 octets must be 0-255, and phone numbers need the shape of a real number (a
``+`` country code, or the North American 3-3-4 layout).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from research.data.spec import PII_KINDS

# Overlapping patterns must be applied in this order (see the module docstring).
APPLY_ORDER: tuple[str, ...] = ("email", "card", "ipv4", "phone")

# RFC 5322 "atext" local parts; letter or punycode ("xn--") top-level domains, which
# digits may follow (masking them later must not leave an address behind). Every
# repetition is bounded (RFC limits), so no input can make matching quadratic.
_EMAIL = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,126}"
    r"(?:[Xx][Nn]--[A-Za-z0-9-]{1,59}|[A-Za-z]{2,63})(?![A-Za-z])"
)

# Every pattern below starts by consuming a character and only then looks behind it:
# a pattern that starts with a look-behind is tried at every position of the text and
# runs several times slower. Digits are ASCII: normalisation folds full-width forms.
_D = "[0-9]"

# A card is either one unbroken run of digits, or groups separated by single spaces or
# hyphens with a four-digit first group (4-4-4-4, 4-6-5, 4-4-4-4-3 ...). Grouped numbers
# must stand alone: a digit group just before or after means the digits belong to
# something else (a phone number followed by a year, say).
_CARD = re.compile(
    rf"{_D}(?<!{_D}{_D})"
    rf"(?:{_D}{{12,18}}(?!{_D})"
    rf"|(?<!{_D}[ -]{_D}){_D}{{3}}(?:[ -]{_D}{{3,7}}){{1,4}}(?![ -]?{_D}))"
)
_CARD_DIGITS = (13, 19)

# Four dotted groups that are not part of a longer dotted number (1.2.3.4.5) nor glued to
# a word (v1.2.3.4); the 0-255 range of each octet is checked on the match.
_IPV4 = re.compile(rf"{_D}(?<![\w.]{_D}){_D}{{0,2}}(?:\.{_D}{{1,3}}){{3}}(?!\w|\.{_D})")

# International numbers start with "+" and a country code; North American ones are
# 3-3-4 digits (optionally after a "1" trunk prefix), with the area code in parentheses
# or the same "-", "." or space between all groups (mixed separators are more often a
# date or a list than a number).
_PHONE_END = rf"(?!\w|[-.]{_D})"
_PHONE = re.compile(
    rf"\+(?<![\w+]\+)[1-9]{_D}{{0,2}}(?:[ .-]?(?:\({_D}{{1,4}}\)|{_D}{{1,4}})){{2,6}}{_PHONE_END}"
    rf"|\((?<![\w.+-]\(){_D}{{3}}\) ?{_D}{{3}}[-. ]{_D}{{4}}{_PHONE_END}"
    rf"|1(?<![\w.+-]1)[-. ](?:\({_D}{{3}}\) ?{_D}{{3}}[-. ]|{_D}{{3}}([-. ]){_D}{{3}}\1){_D}{{4}}{_PHONE_END}"
    rf"|{_D}(?<![\w.+-]{_D}){_D}{{2}}([-. ]){_D}{{3}}\2{_D}{{4}}{_PHONE_END}"
)
# E.164 allows at most 15 digits; fewer than 8 is not a reachable number.
_PHONE_DIGITS = (8, 15)

_NON_DIGIT = re.compile(r"[^0-9]")
_ASCII_DIGITS = b"0123456789"


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries; ``digits`` holds 0-9 only."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _digits_between(text: str, bounds: tuple[int, int]) -> str | None:
    digits = _NON_DIGIT.sub("", text)
    return digits if bounds[0] <= len(digits) <= bounds[1] else None


def _is_card(candidate: str) -> bool:
    digits = _digits_between(candidate, _CARD_DIGITS)
    return digits is not None and luhn_valid(digits)


def _is_phone(candidate: str) -> bool:
    return _digits_between(candidate, _PHONE_DIGITS) is not None


def _is_ipv4(candidate: str) -> bool:
    return all(
        octet == "0" or (octet[0] != "0" and int(octet) <= 255) for octet in candidate.split(".")
    )


@dataclass(frozen=True)
class _Kind:
    pattern: re.Pattern[str]
    placeholder: str
    # Cheap necessary conditions (ASCII digits, occurrences of a marker character) that
    # keep most text away from the regexes.
    min_digits: int
    marker: str = ""
    min_markers: int = 0
    check: Callable[[str], bool] | None = None  # what a regex cannot express


_KINDS: dict[str, _Kind] = {
    "email": _Kind(_EMAIL, "[EMAIL]", 0, marker="@", min_markers=1),
    "card": _Kind(_CARD, "[CARD]", _CARD_DIGITS[0], check=_is_card),
    "ipv4": _Kind(_IPV4, "[IPV4]", 4, marker=".", min_markers=3, check=_is_ipv4),
    "phone": _Kind(_PHONE, "[PHONE]", _PHONE_DIGITS[0], check=_is_phone),
}
PLACEHOLDERS: dict[str, str] = {name: kind.placeholder for name, kind in _KINDS.items()}


@lru_cache(maxsize=64)
def _plan(kinds: frozenset[str]) -> tuple[str, ...]:
    unknown = kinds - set(PII_KINDS)
    if unknown:
        raise ValueError(
            f"unknown PII kind(s) {sorted(unknown)}; known kinds: {', '.join(PII_KINDS)}"
        )
    return tuple(kind for kind in APPLY_ORDER if kind in kinds)


def _mask_kind(text: str, kind: _Kind) -> tuple[str, int]:
    check = kind.check
    if check is None:
        return kind.pattern.subn(kind.placeholder, text)
    replaced = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal replaced
        if check(match.group(0)):
            replaced += 1
            return kind.placeholder
        return match.group(0)

    return kind.pattern.sub(replace, text), replaced


def _ascii_digit_count(text: str) -> int:
    encoded = text.encode("utf-8", "surrogatepass")  # JSON may carry lone surrogates
    return len(encoded) - len(encoded.translate(None, _ASCII_DIGITS))


def mask_pii(text: str, kinds: Iterable[str] = PII_KINDS) -> tuple[str, dict[str, int]]:
    """Replace every recognised item of ``kinds`` by its placeholder.

    Returns the masked text and, for each requested kind, how many items were replaced.
    Raises ValueError for an unknown kind so a misspelt spec never masks nothing quietly.
    """
    plan = _plan(frozenset(kinds))
    counts = dict.fromkeys(plan, 0)
    # Each replacement removes more digits than its placeholder holds: an upper bound.
    digits = _ascii_digit_count(text)
    for name in plan:
        kind = _KINDS[name]
        if digits < kind.min_digits or (kind.marker and text.count(kind.marker) < kind.min_markers):
            continue
        text, counts[name] = _mask_kind(text, kind)
    return text, counts
