"""A synthetic text corpus with known duplicates and personal data, for tests and benchmarks.

Records look like short news snippets: sentences from templates filled with a topic's
vocabulary, so the ``topic`` label is learnable from the text, and a ``score`` that
follows the sentiment of the adjectives used (a regression target with some noise).
Into that stream the generator plants, at the requested rates:

- exact duplicates: another record with the same text (and topic and score);
- near duplicates: a long text with one small edit (a word replaced, inserted or
  removed at an end, or a change of case or punctuation), whose word 3-gram Jaccard
  similarity to its original is at least ``NEAR_DUPLICATE_MIN_JACCARD``;
- personal data: e-mail addresses, phone numbers, IPv4 addresses and Luhn-valid card
  numbers, next to look-alikes that are not personal data (dates, versions, years).

What was planted is reported in a ``GroundTruth`` so tests can measure precision and
recall. Generation streams with bounded memory (planted copies come from a window of
recent records) and is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Record = dict[str, Any]

NEAR_DUPLICATE_MIN_JACCARD = 0.9
MIN_NEAR_DUPLICATE_WORDS = 30
# Planted copies are taken from this many most recent original records.
RECENT_WINDOW = 2048
TEXT_LENGTH = (100, 240)  # target before the sentence that crosses it is finished


def _terms(text: str) -> tuple[str, ...]:
    return tuple(term.strip() for term in text.split(","))


TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # topic -> (nouns, verbs)
    "sports": (
        _terms(
            "team, coach, match, league, striker, stadium, season, goalkeeper, trophy, "
            "referee, crowd, transfer, derby, captain, tournament"
        ),
        _terms(
            "won, lost, defended, trained for, celebrated, postponed, dominated, praised, "
            "criticised, prepared for"
        ),
    ),
    "finance": (
        _terms(
            "market, bank, bond, portfolio, investor, dividend, currency, budget, loan, "
            "stock, fund, quarter, merger, audit, pension"
        ),
        _terms(
            "rallied after, reported, raised, cut, forecast, reviewed, approved, delayed, "
            "announced, restructured"
        ),
    ),
    "science": (
        _terms(
            "experiment, telescope, molecule, researcher, laboratory, sample, theory, "
            "genome, particle, climate model, fossil, orbit, dataset, microscope, enzyme"
        ),
        _terms(
            "measured, observed, confirmed, challenged, published, replicated, analysed, "
            "simulated, discovered, calibrated"
        ),
    ),
    "travel": (
        _terms(
            "flight, hotel, beach, passport, itinerary, museum, train, harbour, guide, "
            "suitcase, island, resort, border, trail, ferry"
        ),
        _terms(
            "visited, booked, cancelled, explored, recommended, missed, reached, "
            "photographed, crossed, reviewed"
        ),
    ),
    "food": (
        _terms(
            "recipe, kitchen, chef, bakery, soup, dessert, spice, menu, harvest, bread, "
            "cheese, sauce, vineyard, noodle, orchard"
        ),
        _terms(
            "cooked, tasted, seasoned, served, baked, ordered, grilled, invented, simmered, plated"
        ),
    ),
    "music": (
        _terms(
            "album, concert, guitarist, orchestra, melody, festival, singer, chorus, "
            "rehearsal, drummer, playlist, opera, tour, studio, ballad"
        ),
        _terms(
            "recorded, performed, released, rehearsed, composed, remixed, toured, "
            "headlined, arranged, sampled"
        ),
    ),
    "health": (
        _terms(
            "clinic, patient, nurse, therapy, diet, hospital, symptom, exercise, doctor, "
            "treatment, recovery, checkup, pharmacy, surgeon, ward"
        ),
        _terms(
            "treated, examined, prescribed, monitored, improved, recommended, screened, "
            "discharged, diagnosed, supported"
        ),
    ),
    "technology": (
        _terms(
            "software, server, laptop, startup, database, network, app, processor, update, "
            "engineer, robot, compiler, browser, battery, sensor"
        ),
        _terms(
            "shipped, patched, benchmarked, deployed, redesigned, tested, launched, "
            "upgraded, debugged, optimised"
        ),
    ),
}
# Adjective -> sentiment, which the score follows.
ADJECTIVES: dict[str, float] = {
    **dict.fromkeys(
        _terms(
            "excellent, remarkable, steady, promising, bright, smooth, reliable, "
            "delightful, impressive, careful, generous, elegant"
        ),
        1.0,
    ),
    **dict.fromkeys(
        _terms(
            "disappointing, sluggish, noisy, fragile, uncertain, costly, confusing, weak, "
            "late, crowded, clumsy, tense"
        ),
        -1.0,
    ),
    **dict.fromkeys(
        _terms(
            "new, local, large, small, recent, annual, second, quiet, public, final, "
            "regional, early"
        ),
        0.0,
    ),
}
FIRST_NAMES = _terms(
    "Ava, Ben, Chloe, Daniel, Elena, Farid, Grace, Hugo, Ines, James, Keiko, "
    "Liam, Maya, Noah, Olga, Priya, Quentin, Rosa, Samir, Tara, Umar, Vera, "
    "Wei, Yusuf, Zoe"
)
LAST_NAMES = _terms(
    "Adams, Baker, Costa, Dubois, Evans, Fischer, Garcia, Hansen, Ito, Jensen, "
    "Kowalski, Larsen, Moreau, Novak, Okafor, Patel, Rossi, Silva, Tanaka, Weber"
)
CITIES = _terms(
    "Lisbon, Oslo, Nairobi, Denver, Osaka, Leeds, Porto, Quebec, Lyon, Austin, "
    "Gdansk, Cork, Seville, Bergen, Dublin, Perth"
)
TIMES = _terms(
    "on Monday, last week, this morning, late on Friday, over the weekend, "
    "earlier this year, in the spring, after midnight, before the holidays, in 1998, "
    "in 2023, yesterday"
)
# Numbers that must survive PII masking.
LOOKALIKES = _terms(
    "on 2024-05-01, in version 2.4.1, under ticket 48213, at 10:45, "
    "with release 3.10.12, on 12/05/2023, for order 7731-22, in room 404, "
    "at 98.6 degrees, on page 1024"
)
TEMPLATES = (
    "The {adj} {noun} {verb} the {noun2} in {city} {time}.",
    "{person} said the {noun} was {adj} and the {noun2} looked {adj2}.",
    "According to {person}, a {adj} {noun} {verb} the local {noun2}.",
    "In {city}, the {noun} {verb} a {adj} {noun2} {time}.",
    "Many people think the {noun} is {adj}, but the {noun2} remains {adj2}.",
    "Reports from {city} suggest the {noun} {verb} the {noun2} {lookalike}.",
    "{person} from {city} described the {noun} as {adj} {time}.",
    "Nobody expected the {adj} {noun} to matter so much to the {noun2}.",
    "The {noun2} in {city} was {adj}, and the {noun} {verb} it {lookalike}.",
    "A {adj} {noun} and a {adj2} {noun2} were {verb_bare} by {person} {time}.",
)
PII_SENTENCES: dict[str, tuple[str, ...]] = {
    "email": ("Write to {value} for details.", "Contact {person} at {value} directly."),
    "phone": ("Call {value} to book a place.", "{person} can be reached on {value}."),
    "ipv4": ("The request came from {value} again.", "Logs show host {value} timing out."),
    "card": ("The card {value} was charged twice.", "Payment used card number {value}."),
}
EMAIL_DOMAINS = ("example.com", "mail.example.org", "corp.example.net", "example.co.uk")
CARD_PREFIXES = ("4", "51", "52", "53", "54", "55", "6011", "37", "34")

_WORD = re.compile(r"\w+")


@dataclass
class GroundTruth:
    """What the generator planted, by record id."""

    exact_duplicates: dict[str, str] = field(default_factory=dict)  # copy -> original
    near_duplicates: dict[str, str] = field(default_factory=dict)  # edited copy -> original
    pii: dict[str, tuple[str, ...]] = field(default_factory=dict)  # id -> kinds planted

    def to_json(self) -> dict[str, Any]:
        return {
            "exact_duplicates": self.exact_duplicates,
            "near_duplicates": self.near_duplicates,
            "pii": {key: list(kinds) for key, kinds in self.pii.items()},
        }


@dataclass(frozen=True)
class _Original:
    id: str
    text: str
    topic: str
    score: float
    pii: tuple[str, ...]


def word_trigram_jaccard(first: str, second: str) -> float:
    """Jaccard similarity of the case-folded word 3-gram sets: what near-dedup measures."""
    a, b = _trigrams(first), _trigrams(second)
    return len(a & b) / len(a | b) if a or b else 1.0


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.casefold())
    return {tuple(words[i : i + 3]) for i in range(max(1, len(words) - 2))}


def luhn_complete(partial: str) -> str:
    """``partial`` followed by the Luhn check digit that makes it a valid card number."""
    total = 0
    for position, char in enumerate(reversed(partial)):
        value = int(char)
        if position % 2 == 0:  # doubled once the check digit is appended
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return partial + str((10 - total % 10) % 10)


class _Writer:
    """Sentences and planted items, drawn from seeded random generators."""

    def __init__(self, seed: int, topics: list[str]) -> None:
        self.rng = random.Random(seed)
        self.topics = topics
        self.adjectives = tuple(ADJECTIVES)
        self._numbers = np.random.default_rng(seed)
        self._draws: list[list[int]] = []
        # Upper bounds of the bulk draws behind each sentence (see ``sentence``).
        self._highs = [
            6,
            len(topics),
            len(self.adjectives),
            len(self.adjectives),
            1 << 30,
            1 << 30,
            1 << 30,
            len(CITIES),
            len(TIMES),
            len(FIRST_NAMES),
            len(LAST_NAMES),
            len(LOOKALIKES),
            len(TEMPLATES),
        ]

    def person(self) -> str:
        return f"{self.rng.choice(FIRST_NAMES)} {self.rng.choice(LAST_NAMES)}"

    def sentence(self, topic: str, used: list[str]) -> str:
        """One filled template, mostly about ``topic`` (one in six wanders off it).

        The choices come from random numbers drawn in bulk: one draw per choice would
        make generating a million records several times slower.
        """
        if not self._draws:
            self._draws = self._numbers.integers(0, self._highs, size=(4096, 13)).tolist()
        wander, other, adj, adj2, noun, noun2, verb, city, time, first, last, aside, form = (
            self._draws.pop()
        )
        nouns, verbs = TOPICS[self.topics[other] if wander == 0 else topic]
        adj, adj2 = self.adjectives[adj], self.adjectives[adj2]
        verb = verbs[verb % len(verbs)]
        used += (adj, adj2)
        text = TEMPLATES[form].format(
            adj=adj,
            adj2=adj2,
            noun=nouns[noun % len(nouns)],
            noun2=nouns[noun2 % len(nouns)],
            verb=verb,
            verb_bare=verb.split(" ")[0],
            city=CITIES[city],
            time=TIMES[time],
            person=f"{FIRST_NAMES[first]} {LAST_NAMES[last]}",
            lookalike=LOOKALIKES[aside],
        )
        return text[0].upper() + text[1:]

    def text(self, topic: str) -> tuple[str, list[str]]:
        target = self.rng.randint(*TEXT_LENGTH)
        used: list[str] = []
        sentences: list[str] = []
        length = -1
        while length < target:
            sentences.append(self.sentence(topic, used))
            length += len(sentences[-1]) + 1
        return " ".join(sentences), used

    def pii_value(self, kind: str) -> str:
        rng = self.rng
        if kind == "email":
            local = f"{rng.choice(FIRST_NAMES)}.{rng.choice(LAST_NAMES)}".lower()
            if rng.random() < 0.5:
                local += str(rng.randint(1, 99))
            return f"{local}@{rng.choice(EMAIL_DOMAINS)}"
        if kind == "phone":
            area, exchange, line = (
                rng.randint(201, 989),
                rng.randint(200, 999),
                rng.randint(0, 9999),
            )
            return rng.choice(
                (
                    f"({area}) {exchange}-{line:04d}",
                    f"{area}-{exchange}-{line:04d}",
                    f"{area}.{exchange}.{line:04d}",
                    f"+1-{area}-{exchange}-{line:04d}",
                    f"+44 20 {rng.randint(7000, 8999)} {line:04d}",
                    f"+49 30 {rng.randint(100000, 999999)}",
                )
            )
        if kind == "ipv4":
            return ".".join(str(rng.randint(1 if i == 0 else 0, 255)) for i in range(4))
        prefix = rng.choice(CARD_PREFIXES)
        length = 15 if prefix in ("34", "37") else 16
        body = prefix + "".join(str(rng.randint(0, 9)) for _ in range(length - len(prefix) - 1))
        number = luhn_complete(body)
        separator = rng.choice(("", " ", "-"))
        if length == 15:
            groups = (number[:4], number[4:10], number[10:])
        else:
            groups = tuple(number[i : i + 4] for i in range(0, 16, 4))
        return separator.join(groups)

    def plant_pii(self, text: str) -> tuple[str, tuple[str, ...]]:
        kinds = self.rng.sample(sorted(PII_SENTENCES), k=self.rng.choice((1, 1, 1, 2)))
        for kind in kinds:
            sentence = self.rng.choice(PII_SENTENCES[kind]).format(
                value=self.pii_value(kind), person=self.person()
            )
            text = f"{text} {sentence}" if self.rng.random() < 0.5 else f"{sentence} {text}"
        return text, tuple(sorted(kinds))

    def near_copy(self, text: str) -> str | None:
        """A slightly edited copy, or None if no edit keeps the similarity high enough."""
        for _ in range(4):
            candidate = self._edit(text)
            if candidate != text and word_trigram_jaccard(text, candidate) >= (
                NEAR_DUPLICATE_MIN_JACCARD
            ):
                return candidate
        return None

    def _edit(self, text: str) -> str:
        rng = self.rng
        words = text.split(" ")
        edit = rng.randrange(5)
        if edit == 0:  # replace the last word, keeping its punctuation
            last = words[-1]
            words[-1] = rng.choice(self.adjectives) + last[len(last.rstrip(".!?,")) :]
        elif edit == 1:  # insert a word before the last one
            words.insert(len(words) - 1, rng.choice(self.adjectives))
        elif edit == 2:  # drop the first word
            words = words[1:]
            words[0] = words[0][:1].upper() + words[0][1:]
        elif edit == 3:  # change the case of one word
            index = rng.randrange(len(words))
            words[index] = words[index].upper()
        else:  # change the final punctuation and drop a comma
            words[-1] = words[-1].rstrip(".!?") + rng.choice(("!", "...", " ."))
            return " ".join(words).replace(",", "", 1)
        return " ".join(words)


def generate_corpus(
    num_records: int,
    *,
    seed: int = 0,
    duplicate_rate: float = 0.05,
    near_duplicate_rate: float = 0.05,
    pii_rate: float = 0.05,
    num_classes: int = 4,
    truth: GroundTruth | None = None,
) -> Iterator[Record]:
    """Stream ``num_records`` records ``{"id", "text", "topic", "score"}``.

    Pass a ``GroundTruth`` to have what is planted recorded in it as records stream by.
    The duplicate rates are fractions of all records (a planted copy needs a suitable
    recent original, so the first records are always originals); ``pii_rate`` is the
    fraction of original texts given personal data, which their exact copies keep.
    """
    _check_options(num_records, duplicate_rate, near_duplicate_rate, pii_rate, num_classes)
    return _generate(
        num_records, seed, duplicate_rate, near_duplicate_rate, pii_rate, num_classes, truth
    )


def _generate(
    num_records: int,
    seed: int,
    duplicate_rate: float,
    near_duplicate_rate: float,
    pii_rate: float,
    num_classes: int,
    truth: GroundTruth | None,
) -> Iterator[Record]:
    topics = sorted(TOPICS)[:num_classes]
    writer = _Writer(seed, topics)
    rng = writer.rng
    recent: deque[_Original] = deque(maxlen=RECENT_WINDOW)
    long_recent: deque[_Original] = deque(maxlen=RECENT_WINDOW)
    width = max(7, len(str(num_records - 1)))
    for index in range(num_records):
        record_id = f"doc-{index:0{width}d}"
        draw = rng.random()
        if draw < duplicate_rate and recent:
            original = rng.choice(recent)
            if truth is not None:
                truth.exact_duplicates[record_id] = original.id
                if original.pii:
                    truth.pii[record_id] = original.pii
            yield _record(record_id, original.text, original.topic, original.score)
            continue
        if draw < duplicate_rate + near_duplicate_rate and long_recent:
            original = rng.choice(long_recent)
            edited = writer.near_copy(original.text)
            if edited is not None:
                if truth is not None:
                    truth.near_duplicates[record_id] = original.id
                yield _record(record_id, edited, original.topic, original.score)
                continue
        topic = rng.choice(topics)
        text, adjectives = writer.text(topic)
        kinds: tuple[str, ...] = ()
        if rng.random() < pii_rate:
            text, kinds = writer.plant_pii(text)
            if truth is not None:
                truth.pii[record_id] = kinds
        sentiment = sum(ADJECTIVES[a] for a in adjectives) / len(adjectives)
        score = round(0.5 + 0.3 * sentiment + 0.05 * topics.index(topic) + rng.gauss(0, 0.05), 4)
        original = _Original(record_id, text, topic, score, kinds)
        recent.append(original)
        # Edits could break a planted item, so near duplicates come from clean texts.
        if not kinds and text.count(" ") + 1 >= MIN_NEAR_DUPLICATE_WORDS:
            long_recent.append(original)
        yield _record(record_id, text, topic, score)


def _record(record_id: str, text: str, topic: str, score: float) -> Record:
    return {"id": record_id, "text": text, "topic": topic, "score": score}


def _check_options(
    num_records: int, duplicate: float, near: float, pii: float, num_classes: int
) -> None:
    if num_records < 0:
        raise ValueError(f"num_records must be >= 0, got {num_records}")
    for name, rate in (
        ("duplicate_rate", duplicate),
        ("near_duplicate_rate", near),
        ("pii_rate", pii),
    ):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {rate}")
    if duplicate + near >= 1.0:
        raise ValueError("duplicate_rate + near_duplicate_rate must leave room for originals")
    if not 1 <= num_classes <= len(TOPICS):
        raise ValueError(f"num_classes must be between 1 and {len(TOPICS)}, got {num_classes}")


def write_corpus_jsonl(path: str | Path, num_records: int, **options: Any) -> GroundTruth:
    """Write the corpus as JSON lines (streaming) and return what was planted."""
    truth = GroundTruth()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    with path.open("w", encoding="utf-8", buffering=1 << 20) as handle:
        for record in generate_corpus(num_records, truth=truth, **options):
            handle.write(dumps(record))
            handle.write("\n")
    return truth
