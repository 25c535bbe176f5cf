"""PII masking: every kind is found, look-alikes survive, and counts add up."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.data.pii import PLACEHOLDERS, luhn_valid, mask_pii
from research.data.spec import PII_KINDS
from research.data.synthetic import luhn_complete

VALID_CARDS = [
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111111",
    "5500 0000 0000 0004",
    "3782 822463 10005",  # American Express, 4-6-5
    "6011000990139424",
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+news@example.co.uk today", "write to [EMAIL] today"),
        ("JOHN_SMITH@Mail.Example.ORG.", "[EMAIL]."),
        ("odd but valid: a!b#c@example.xn--p1ai", "odd but valid: [EMAIL]"),
    ],
)
def test_emails_are_masked(text: str, expected: str) -> None:
    assert mask_pii(text) == (expected, {"email": 1, "card": 0, "ipv4": 0, "phone": 0})


@pytest.mark.parametrize(
    "phone",
    [
        "+44 20 7946 0958",
        "+1-415-555-0134",
        "+1 (415) 555-0134",
        "+442079460958",
        "(415) 555-0134",
        "415.555.0134",
        "415-555-0134",
        "415 555 0134",
        "1-800-555-0199",
    ],
)
def test_phone_numbers_are_masked(phone: str) -> None:
    masked, counts = mask_pii(f"Call {phone} after six.")
    assert masked == "Call [PHONE] after six."
    assert counts["phone"] == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ring 020 7946 0958 after six.", "Ring [PHONE] after six."),  # London, national
        ("Appelez le 06 12 34 56 78 demain.", "Appelez le [PHONE] demain."),  # French mobile
        ("Tel. 01 23 45 67 89, bureau", "Tel. [PHONE], bureau"),  # French landline
        ("Berlin: +49 30 901820.", "Berlin: [PHONE]."),
        ("Berlin: 030 901820.", "Berlin: [PHONE]."),  # German, national
        ("Handy 0151 23456789", "Handy [PHONE]"),
        ("from abroad 0044 20 7946 0958", "from abroad [PHONE]"),  # "00" international prefix
        ("+33 6 12 34 56 78 or +33612345678", "[PHONE] or [PHONE]"),
        ("+44 (0)20 7946 0958", "[PHONE]"),
        ("Manchester 0161 496 0000", "Manchester [PHONE]"),
        ("area code nobody has yet: 237-555-0134", "area code nobody has yet: [PHONE]"),
        ("+1-237-555-0134 too", "[PHONE] too"),
    ],
)
def test_international_and_national_numbers_are_masked(text: str, expected: str) -> None:
    masked, counts = mask_pii(text)
    assert masked == expected
    assert counts["phone"] == expected.count("[PHONE]")


@pytest.mark.parametrize(
    "text",
    [
        "on 2024-05-01 at 10:45:30",
        "on 12/05/2023, 05.12.2023 and 2024/05/01",
        "timestamp 2003-02-01T10:11:12",
        "date 31.12.1999 and 01.02.2024",
        "ISBN 978-3-16-148410-0 and ISBN 0-306-40615-2",
        "ISBN-13: 9780306406157",
        "isbn 0-8044-2957-X",
        "978-0-306-40615-7 printed",
        "a plain number 12345678, and 20240501",
        "zip 75008 Paris, ticket 48213, page 1024",
        "in 1998 and 2024",
        "call 4155550134 is an id here",  # unbroken national digits: an id as often as not
    ],
)
def test_numbers_that_are_not_phone_numbers_are_kept(text: str) -> None:
    masked, counts = mask_pii(text)
    assert masked == text
    assert sum(counts.values()) == 0


def test_national_formats_follow_the_regions_asked_for() -> None:
    text = "UK 020 7946 0958, FR 06 12 34 56 78, US (415) 555-0134, DE +49 30 901820"
    assert mask_pii(text, ["phone"], ["FR"])[0] == (
        "UK 020 7946 0958, FR [PHONE], US (415) 555-0134, DE [PHONE]"
    )
    # Numbers written with "+" and a country code need no region.
    assert mask_pii(text, ["phone"], [])[0] == (
        "UK 020 7946 0958, FR 06 12 34 56 78, US (415) 555-0134, DE [PHONE]"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version 1.2.3.4 is out", "version 1.2.3.4 is out"),
        ("Version: 10.0.0.1", "Version: 10.0.0.1"),
        ("upgrade to v 1.2.3.4", "upgrade to v 1.2.3.4"),
        ("see build 1.2.3.4 and release 4.3.2.1", "see build 1.2.3.4 and release 4.3.2.1"),
        ("from 192.168.0.1 again", "from [IPV4] again"),
        ("version 2 runs on 10.0.0.1", "version 2 runs on [IPV4]"),
        ("server 1.2.3.4 said version", "server [IPV4] said version"),
        ("1.2.3.4", "[IPV4]"),
    ],
)
def test_a_dotted_quad_named_a_version_is_not_an_address(text: str, expected: str) -> None:
    assert mask_pii(text)[0] == expected


def test_a_card_number_named_an_isbn_is_kept() -> None:
    isbn = luhn_complete("978030640615")  # an ISBN-13 that passes the card checksum too
    assert mask_pii(f"card {isbn} declined")[0] == "card [CARD] declined"
    assert mask_pii(f"ISBN {isbn} in stock")[0] == f"ISBN {isbn} in stock"


def test_unknown_phone_regions_are_refused_in_the_spec() -> None:
    from pydantic import ValidationError

    from research.data.spec import PiiSpec

    assert PiiSpec(phone_regions=["GB", "IN"]).phone_regions == ["GB", "IN"]
    with pytest.raises(ValidationError, match="unknown phone region.*'UK'"):
        PiiSpec(phone_regions=["UK"])


@pytest.mark.parametrize("card", VALID_CARDS)
def test_luhn_valid_cards_are_masked_as_cards_not_phones(card: str) -> None:
    masked, counts = mask_pii(f"card {card} declined")
    assert masked == "card [CARD] declined"
    assert counts == {"email": 0, "card": 1, "ipv4": 0, "phone": 0}


@pytest.mark.parametrize("address", ["192.168.0.1", "10.0.0.255", "0.0.0.0", "8.8.4.4"])
def test_ipv4_addresses_are_masked(address: str) -> None:
    assert mask_pii(f"from {address}, again")[0] == "from [IPV4], again"


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 was refused",  # fails the Luhn check
        "order 4111111111111112 shipped",
        "founded in 1998, moved in 2024",
        "released on 2024-05-01 at 10:45",
        "on 12/05/2023 and 05.12.2023",
        "upgrade to version 2.4.1 or 10.15.7",
        "see v1.2.3.4 and build 1.2.3.4.5",
        "octets 256.1.1.1 and 1.2.3.999 are not addresses",
        "ticket 48213, room 404, order 7731-22",
        "an id of 20 digits 12345678901234567890 is no card",
        "temperature 98.6 and pi 3.14159",
        "x +1 2 3 is arithmetic",
        "mixed 415-555 0134 separators",
        "no@tld and user@host without a dot",
    ],
)
def test_lookalikes_are_kept(text: str) -> None:
    masked, counts = mask_pii(text)
    assert masked == text
    assert sum(counts.values()) == 0


def test_counts_every_item_of_every_kind() -> None:
    text = (
        "a@example.com, b@example.org; call 415-555-0134 or +44 20 7946 0958; "
        "hosts 10.0.0.1 and 10.0.0.2 and 10.0.0.3; card 4111 1111 1111 1111."
    )
    masked, counts = mask_pii(text)
    assert counts == {"email": 2, "card": 1, "ipv4": 3, "phone": 2}
    assert masked == (
        "[EMAIL], [EMAIL]; call [PHONE] or [PHONE]; "
        "hosts [IPV4] and [IPV4] and [IPV4]; card [CARD]."
    )


def test_only_the_requested_kinds_are_masked() -> None:
    text = "mail a@example.com or call 415-555-0134 from 10.1.2.3"
    masked, counts = mask_pii(text, ["phone"])
    assert masked == "mail a@example.com or call [PHONE] from 10.1.2.3"
    assert counts == {"phone": 1}


def test_emails_go_first_so_digits_inside_them_stay_an_email() -> None:
    masked, counts = mask_pii("reply to 4111111111111111@example.com")
    assert masked == "reply to [EMAIL]"
    assert counts["card"] == 0


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown PII kind"):
        mask_pii("text", ["email", "ssn"])


def test_luhn_check() -> None:
    assert luhn_valid("4111111111111111")
    assert luhn_valid("378282246310005")
    assert not luhn_valid("4111111111111112")
    assert luhn_complete("411111111111111") == "4111111111111111"


@pytest.mark.slow
def test_pathological_input_is_linear_not_quadratic() -> None:
    # A regex that backtracks quadratically would take minutes on these.
    for text in ("a" * 200_000 + "@", "1" * 200_000, "1." * 100_000, "+1" * 100_000):
        assert mask_pii(text)[0] == text


# --------------------------------------------------------------------------- properties

# A run that is not part of a decimal number ("0.4111111111111111" is a number).
_LUHN_16 = re.compile(r"(?<!\d)(?<!\d[.,])\d{16}(?!\d|[.,]\d)")
_EMAIL_LIKE = re.compile(
    r"[A-Za-z0-9._%+-]@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9])"
)


@st.composite
def _card_numbers(draw: st.DrawFn) -> str:
    body = draw(st.text(alphabet="0123456789", min_size=15, max_size=15))
    number = luhn_complete(body)
    separator = draw(st.sampled_from(["", " ", "-"]))
    return separator.join(number[i : i + 4] for i in range(0, 16, 4))


_fragments = st.one_of(
    _card_numbers(),
    st.emails(),
    st.text(alphabet="0123456789", min_size=1, max_size=20),
    st.text(alphabet="abcXYZ019.-@+ ()", min_size=1, max_size=12),
    st.sampled_from(["call", "card", "the", "2024-05-01", "v1.2.3", "10.0.0.1", "+44"]),
)
_texts = st.lists(
    st.tuples(_fragments, st.sampled_from(["", " ", "-", ".", "@", ", "])), max_size=12
).map(lambda parts: "".join(fragment + glue for fragment, glue in parts))


@settings(max_examples=300, deadline=None)
@given(_texts)
def test_masked_text_has_no_luhn_valid_16_digit_run(text: str) -> None:
    masked, _ = mask_pii(text)
    assert not [run for run in _LUHN_16.findall(masked) if luhn_valid(run)]


@settings(max_examples=300, deadline=None)
@given(_texts)
def test_masked_text_has_no_email_left(text: str) -> None:
    masked, _ = mask_pii(text)
    assert _EMAIL_LIKE.search(masked) is None


@settings(max_examples=200, deadline=None)
@given(st.emails())
def test_any_valid_email_is_masked_whole(email: str) -> None:
    assert mask_pii(f"write to {email} now", ["email"]) == ("write to [EMAIL] now", {"email": 1})


@settings(max_examples=200, deadline=None)
@given(_texts)
def test_counts_match_the_placeholders_written(text: str) -> None:
    masked, counts = mask_pii(text)
    for kind in PII_KINDS:
        placeholder = PLACEHOLDERS[kind]
        assert masked.count(placeholder) - text.count(placeholder) == counts[kind]


def test_lone_surrogates_from_json_do_not_break_masking() -> None:
    text = "\udc80 mail a@example.com \ud800"
    assert mask_pii(text) == (
        "\udc80 mail [EMAIL] \ud800",
        {"email": 1, "card": 0, "ipv4": 0, "phone": 0},
    )


# --------------------------------------------------------------------------- decimals


@pytest.mark.parametrize(
    "text",
    [
        "the ratio 0.123456789 is small",
        "Accuracy moved from 0.2146 to 0.1684 after we retrained the model on 20 000 more rows",
        "loss -0.123456789, lr 1.5e-05, p = 0.00012345678",
        "12.3456789 kg, 3.5 kg, 98.7654321% and 1,234.5678901 EUR",
        "1.234.567,891 und 0,0612345678 und 2,02079460958",  # decimal commas
        "1 234 567,89 et 49 861 079,92196",  # grouped by spaces
        "0.2146,0.1684,0.12345678,1.5",  # a row of values
        "pi 3.14159265358979, 6.02214076e23, avogadro",
        "0.4111111111111111 passes the Luhn check",
        "+0.123456789 and +1.2345678901",  # signed
    ],
)
def test_decimal_numbers_are_not_masked(text: str) -> None:
    assert mask_pii(text) == (text, dict.fromkeys(PII_KINDS, 0))


_FLOAT_FORMATS = ["{!r}", "{:.10f}", "{:.4f}", "{:,.6f}", "{:.9e}", "{:g}", "{:.7%}", "{:_.8f}"]


@st.composite
def _decimals(draw: st.DrawFn) -> str:
    value = draw(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
    text = draw(st.sampled_from(_FLOAT_FORMATS)).format(value)
    if "." not in text and "e" not in text:
        text += "." + draw(st.text(alphabet="0123456789", min_size=1, max_size=12))
    style = draw(st.sampled_from(["en", "de", "fr"]))
    if style == "de":  # 1.234.567,89
        text = text.replace(",", "#").replace(".", ",").replace("#", ".").replace("_", ".")
    elif style == "fr":  # 1 234 567,89
        text = (
            text.replace(",", "").replace(".", ",").replace("_", draw(st.sampled_from(" \u202f")))
        )
    else:
        text = text.replace("_", ",")
    return text + draw(st.sampled_from(["", "", "%", " kg", "ms", " EUR"]))


@settings(max_examples=500, deadline=None)
@given(
    _decimals(),
    st.sampled_from(["{}", "the ratio {} is small", "moved from {} after", "({})", "x={};"]),
)
def test_a_decimal_in_any_format_is_never_masked(decimal: str, sentence: str) -> None:
    text = sentence.format(decimal)
    assert mask_pii(text) == (text, dict.fromkeys(PII_KINDS, 0))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9),
        min_size=2,
        max_size=8,
    ),
    st.sampled_from(_FLOAT_FORMATS[:6]),
    st.sampled_from([",", ", ", " ", "; ", "\t", " to ", "-", "/", "|"]),
)
def test_a_list_of_decimals_is_never_masked(values: list[float], form: str, glue: str) -> None:
    parts = [form.format(value) for value in values]
    text = glue.join(part if "." in part or "e" in part else part + ".5" for part in parts)
    assert mask_pii(text)[1] == dict.fromkeys(PII_KINDS, 0)


@pytest.mark.parametrize(
    "phone",
    [
        "+44 20 7946 0958",
        "+442079460958",
        "+44.20.7946.0958",
        "+33 6 12 34 56 78",
        "0044 20 7946 0958",
        "020 7946 0958",
        "0161 496 0000",
        "06 12 34 56 78",
        "06.12.34.56.78",
        "030 901820",
        "0151 23456789",
        "0151.23456789",
        "(415) 555-2671",
        "415.555.2671",
        "415-555-2671",
        "415 555 2671",
        "1-800-555-0199",
    ],
)
@pytest.mark.parametrize(
    "around",
    [
        "Call {} after six.",
        "{}",
        "7,{},x",  # a row of comma-separated values
        "0.5,{},0.25",
        "pH 7.4, tel. {}, 3.5 kg",
        "between 0.2146 and 0.1684 call {} now",
    ],
)
def test_phone_numbers_next_to_decimals_are_still_masked(phone: str, around: str) -> None:
    masked, counts = mask_pii(around.format(phone))
    assert masked == around.format("[PHONE]")
    assert counts["phone"] == 1


def test_dotted_quads_stay_addresses_unless_named_a_version() -> None:
    assert mask_pii("version 1.2.3.4 with 0.123456789")[0] == "version 1.2.3.4 with 0.123456789"
    assert mask_pii("host 10.1.2.3, ratio 0.2146")[0] == "host [IPV4], ratio 0.2146"
