"""Generated texts of every awkward kind, for tests that text handling agrees everywhere.

Tokenizing and bagging must give the same ids in the input pipeline as in an exported
serving graph; these texts hold what breaks that first: empty and whitespace-only strings,
punctuation runs, scripts and emoji beyond ASCII, combining marks and very long texts.
"""

from __future__ import annotations

import random

WORDS = ["river", "mill", "naïve", "straße", "東京", "данные", "ελληνικά", "🙂", "👍🏽", "e\u0301t"]
PUNCTUATION = "!?.,;:…—–-«»\"'()[]{}<>/\\@#$%^&*_+=|~`"


def varied_texts(count: int, seed: int = 0) -> list[str]:
    """Generated texts of every awkward kind: empty, whitespace, punctuation, unicode, long."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    kinds = [
        lambda: "",
        lambda: rng.choice([" ", "\t", "  \t ", "\n", " \n \t "]),
        lambda: "".join(rng.choice(PUNCTUATION) for _ in range(rng.randint(1, 30))),
        lambda: words(rng.randint(1, 12)),
        lambda: words(rng.randint(1, 6)) + rng.choice(PUNCTUATION) + "  " + words(3),
        lambda: "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 40))),
        lambda: words(rng.randint(600, 1500)),  # very long: thousands of characters
        lambda: f"  {words(4).upper()}\t{rng.randint(0, 10**9)}  ",
    ]
    return [rng.choice(kinds)() for _ in range(count)]
