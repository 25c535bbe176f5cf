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
IPv4 octets must be 0-255, and a number that a label names as something else
("version 1.2.3.4", "ISBN 0-306-40615-2") is left alone. Phone numbers are found by
Google's libphonenumber (the ``phonenumbers`` port), which knows every country's
numbering plan:

- a number written with ``+`` and a country code is masked when its length is possible
  for that country, whatever the regions;
- a national number (``020 7946 0958``, ``06 12 34 56 78``) is masked when it is valid
  in one of the spec's ``phone_regions`` *and* grouped the way that country writes its
  numbers (libphonenumber's strict grouping), which is what keeps dates, ISBNs and
  plain numbers out;
- in North America libphonenumber accepts only assigned area codes, so a number with a
  new or unlisted one would leak: there any possible number written in the 3-3-4
  layout counts — area code in parentheses, or the same "-", "." or space between all
  groups (mixed separators are more often a date or a list than a number).

A number written as a decimal is never a phone number nor a card, whatever its digits:
libphonenumber reads ``0.1684`` or ``0.123456789`` as a national number of some regions
(a trunk "0", then digits), and a long fraction can pass the Luhn check. A decimal is an
integer part — ``0``, or digits without a leading zero, plain or grouped in thousands
(``1,234``, ``1.234``, ``1 234``) — then a single ``.`` or ``,`` decimal mark and digits;
a sign, an exponent, a percent sign or a unit may follow. A phone match is refused when
one of the numbers it is made of has that form, or when it is one unbroken run of digits
that the digits, ``.`` and ``,`` written against it make into a decimal (the fraction of
``0,0612345678``). No phone number is written that way: a national number starts with its
trunk "0" or is grouped in several groups (``020.7946.0958``, ``415.555.0134``,
``0151.23456789`` all stay phones). The forms both can take read as the decimal: an
unbroken number right after a number and a comma (``7,0612345678`` in a line of
comma-separated values), and a single "." among spaces (``020 7946.0958``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import phonenumbers
from phonenumbers import Leniency, PhoneNumberMatcher

from research.data.spec import DEFAULT_PHONE_REGIONS, PII_KINDS

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
# The digits of a decimal number's fraction or integer part ("0.4111111111111111") are
# not a card either.
_CARD = re.compile(
    rf"{_D}(?<!{_D}{_D})(?<!{_D}[.,]{_D})"
    rf"(?:{_D}{{12,18}}(?!{_D}|[.,]{_D})"
    rf"|(?<!{_D}[ -]{_D}){_D}{{3}}(?:[ -]{_D}{{3,7}}){{1,4}}(?![ -]?{_D}|[.,]{_D}))"
)
_CARD_DIGITS = (13, 19)

# Four dotted groups that are not part of a longer dotted number (1.2.3.4.5) nor glued to
# a word (v1.2.3.4); the 0-255 range of each octet is checked on the match.
_IPV4 = re.compile(rf"{_D}(?<![\w.]{_D}){_D}{{0,2}}(?:\.{_D}{{1,3}}){{3}}(?!\w|\.{_D})")

# A label just before a number that says what the number is: then it is not personal
# data, whatever it looks like ("version 10.0.0.1", "ISBN 978-0-306-40615-7").
_LABEL_BEFORE = re.compile(
    r"(?:\b(?:isbn(?:-1[03])?|issn|doi|version|ver|release|build|firmware|revision|rev)"
    r"|(?<![\w.])v)\.?[ \t]*[:#]?[ \t]*$",
    re.IGNORECASE,
)
_LABEL_WINDOW = 24  # characters looked at before a number for its label

# The North American 3-3-4 layout (see the module docstring), optionally after a "1".
_NANP_LAYOUT = re.compile(
    rf"(?:1[-. ])?(?:\({_D}{{3}}\) ?{_D}{{3}}[-. ]{_D}{{4}}|{_D}{{3}}([-. ]){_D}{{3}}\1{_D}{{4}})"
)
# E.164 allows at most 15 digits; fewer than 8 is not a reachable number.
_PHONE_DIGITS = (8, 15)
# Characters that glue a number to what is around it: "v415-555-0134", "0-8044-2957-X".
_GLUE_BEFORE = re.compile(r"[\w.+-]")
_GLUE_AFTER = re.compile(r"\w|[-.]\w")

# A number written as a decimal (see the module docstring): the integer part is 0, or has
# no leading zero, plain or grouped in thousands by one separator that differs from the
# decimal mark. Digits are any decimal digits, as they are for libphonenumber.
_DECIMAL_FORM = r"(?:0|[1-9]\d*|[1-9]\d{0,2}(?:([ ,.\u00a0\u2009\u202f])\d{3})+)(?!\1)[.,]\d+"
_DECIMAL = re.compile(_DECIMAL_FORM)
# A decimal among the numbers of a phone match: not part of a longer run of digits and
# marks within the match (what is around the match is judged apart, see _in_decimal).
_DECIMAL_INSIDE = re.compile(rf"(?<![\d.,]){_DECIMAL_FORM}(?!\d|[.,]\d)")
# The first number of a match (digits, with decimal marks or thousands separators
# between them), after the punctuation the matcher may take along ("(", a space); none
# when the match starts with "+".
_FIRST_NUMBER = re.compile(r"[^\d+]*(\d(?:[\d.,\u0020\u00a0\u2009\u202f]*\d)?)")
_NO_DIGIT = re.compile(r"\D*")
_SPACES = frozenset("\u0020\u00a0\u2009\u202f")  # thousands separators
_DECIMAL_SEPARATORS = _SPACES | {".", ","}
_NUMBER_REACH = 64  # characters looked at on each side of an unbroken match

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


def _labelled(text: str, start: int) -> bool:
    """Whether the number starting at ``start`` follows a label such as "version" or "ISBN"."""
    return _LABEL_BEFORE.search(text, max(0, start - _LABEL_WINDOW), start) is not None


def _is_card(match: re.Match[str]) -> bool:
    digits = _digits_between(match.group(0), _CARD_DIGITS)
    return digits is not None and luhn_valid(digits) and not _labelled(match.string, match.start())


def _is_ipv4(match: re.Match[str]) -> bool:
    octets = match.group(0).split(".")
    in_range = all(octet == "0" or (octet[0] != "0" and int(octet) <= 255) for octet in octets)
    return in_range and not _labelled(match.string, match.start())


# ------------------------------------------------------------------------------ phones


@lru_cache(maxsize=256)
def _is_nanp(region: str) -> bool:
    return phonenumbers.country_code_for_region(region) == 1


def _stands_alone(text: str, start: int, end: int) -> bool:
    glued_before = start > 0 and _GLUE_BEFORE.match(text, start - 1) is not None
    return not glued_before and _GLUE_AFTER.match(text, end) is None


def _in_decimal(text: str, start: int, end: int) -> bool:
    """Whether the phone match ``text[start:end]`` holds, or is part of, a decimal number."""
    if _DECIMAL_INSIDE.search(text[start:end]):
        return True
    first = _FIRST_NUMBER.match(text, start, end)
    if first is None:  # written with "+", or no digit first
        return False
    # Does the match's first number finish a decimal written before it? It may be the
    # fraction ("0,0612345678") or the last groups ("1,205,049.649047", "12 075.89354")
    # of one; when it is the match's only number, also its integer part ("360857,1377024").
    # A number without a mark is taken as a decimal's part only when nothing follows it
    # in the match: "7,020 7946 0958" is a value and a phone number, whatever "7,020" is.
    number_start, number_end = first.span(1)
    only = _NO_DIGIT.fullmatch(text, number_end, end) is not None
    ends = {
        stop
        for stop in _number_ends(text, number_start, number_end)
        if only and stop == number_end or _has_mark(text, number_start, stop)
    }
    if only:
        right = number_end
        while right < min(len(text), number_end + _NUMBER_REACH) and _number_char(text[right]):
            right += 1
        ends.add(number_end + len(text[number_end:right].rstrip(".,")))
    if not ends:
        return False
    for position in range(number_start, max(0, number_start - _NUMBER_REACH) - 1, -1):
        char = text[position]
        if not char.isdecimal():
            if char not in _DECIMAL_SEPARATORS:
                return False
        elif (position == 0 or not text[position - 1].isdecimal()) and any(
            _DECIMAL.fullmatch(text, position, stop) for stop in ends
        ):
            return True
    return False


def _number_ends(text: str, start: int, end: int) -> list[int]:
    """Where the number ``text[start:end]`` could end: before each space, and at its end."""
    return [
        stop
        for stop in range(start + 1, end)
        if text[stop] in _SPACES and text[stop - 1].isdecimal()
    ] + [end]


def _has_mark(text: str, start: int, end: int) -> bool:
    return "." in text[start:end] or "," in text[start:end]


def _number_char(char: str) -> bool:
    return char.isdecimal() or char in ".,"


def _phone_spans(text: str, regions: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of every phone number, non-overlapping, in text order."""
    spans = []
    # Region None parses only numbers written with "+" and a country code.
    for match in PhoneNumberMatcher(text, None, leniency=Leniency.POSSIBLE):
        if _digits_between(match.raw_string, _PHONE_DIGITS):
            spans.append((match.start, match.end))
    for region in regions:
        nanp = _is_nanp(region)
        leniency = Leniency.POSSIBLE if nanp else Leniency.STRICT_GROUPING
        for match in PhoneNumberMatcher(text, region, leniency=leniency):
            raw = match.raw_string
            if raw.startswith("+") or (nanp and not _NANP_LAYOUT.fullmatch(raw)):
                continue
            spans.append((match.start, match.end))
    found: list[tuple[int, int]] = []
    for start, end in sorted(spans, key=lambda span: (span[0], -span[1])):
        overlaps = found and start < found[-1][1]
        if (
            not overlaps
            and _stands_alone(text, start, end)
            and not _labelled(text, start)
            and not _in_decimal(text, start, end)
        ):
            found.append((start, end))
    return found


def _mask_phones(text: str, regions: tuple[str, ...]) -> tuple[str, int]:
    spans = _phone_spans(text, regions)
    for start, end in reversed(spans):
        text = f"{text[:start]}[PHONE]{text[end:]}"
    return text, len(spans)


# ------------------------------------------------------------------------------ masking


Masker = Callable[[str, tuple[str, ...]], tuple[str, int]]  # (text, phone regions)


def _pattern_masker(
    pattern: re.Pattern[str], placeholder: str, check: Callable[[re.Match[str]], bool] | None
) -> Masker:
    """Replace the matches of ``pattern`` that pass ``check`` (what a regex cannot express)."""

    def mask(text: str, _regions: tuple[str, ...]) -> tuple[str, int]:
        if check is None:
            return pattern.subn(placeholder, text)
        replaced = 0

        def replace(match: re.Match[str]) -> str:
            nonlocal replaced
            if check(match):
                replaced += 1
                return placeholder
            return match.group(0)

        return pattern.sub(replace, text), replaced

    return mask


@dataclass(frozen=True)
class _Kind:
    placeholder: str
    mask: Masker
    # Cheap necessary conditions (ASCII digits, occurrences of a marker character) that
    # keep most text away from the matchers.
    min_digits: int
    marker: str = ""
    min_markers: int = 0


_KINDS: dict[str, _Kind] = {
    "email": _Kind("[EMAIL]", _pattern_masker(_EMAIL, "[EMAIL]", None), 0, "@", 1),
    "card": _Kind("[CARD]", _pattern_masker(_CARD, "[CARD]", _is_card), _CARD_DIGITS[0]),
    "ipv4": _Kind("[IPV4]", _pattern_masker(_IPV4, "[IPV4]", _is_ipv4), 4, ".", 3),
    "phone": _Kind("[PHONE]", _mask_phones, _PHONE_DIGITS[0]),
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


def _ascii_digit_count(text: str) -> int:
    encoded = text.encode("utf-8", "surrogatepass")  # JSON may carry lone surrogates
    return len(encoded) - len(encoded.translate(None, _ASCII_DIGITS))


def mask_pii(
    text: str,
    kinds: Iterable[str] = PII_KINDS,
    phone_regions: Iterable[str] = DEFAULT_PHONE_REGIONS,
) -> tuple[str, dict[str, int]]:
    """Replace every recognised item of ``kinds`` by its placeholder.

    ``phone_regions`` are the ISO 3166 regions whose national phone formats count.
    Returns the masked text and, for each requested kind, how many items were replaced.
    Raises ValueError for an unknown kind so a misspelt spec never masks nothing quietly.
    """
    plan = _plan(frozenset(kinds))
    regions = tuple(phone_regions)
    counts = dict.fromkeys(plan, 0)
    # Each replacement removes more digits than its placeholder holds: an upper bound.
    digits = _ascii_digit_count(text)
    for name in plan:
        kind = _KINDS[name]
        if digits < kind.min_digits or (kind.marker and text.count(kind.marker) < kind.min_markers):
            continue
        text, counts[name] = kind.mask(text, regions)
    return text, counts
