"""Raw inputs and spec files for dataset builds, every row of them known to the test.

The inputs are small but real: scikit-learn's digits, hand-written tables and texts, and
the example specs, so a test can say exactly which records a build must write.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image

EXAMPLE_SPECS = Path(__file__).resolve().parents[2] / "examples" / "data"
COLOURS = ("red", "green", "blue")


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    """``spec`` as a YAML spec file at ``path``, keys in the order the test wrote them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def copy_example_spec(name: str, directory: Path) -> Path:
    """Copy ``examples/data/<name>`` beside the raw data its relative paths point at."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(EXAMPLE_SPECS / name, directory / name))


def write_digits(raw: Path, duplicates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``digits.npz`` and as a ``digits_images/<class>/`` folder.

    The images at positions ``duplicates`` are written a second time (same pixels,
    same class) at the end, so the build has known duplicates to merge. Returns the
    images (N x 8 x 8 uint8) and labels as written, duplicates included.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target
    images = np.concatenate([images, images[list(duplicates)]])
    labels = np.concatenate([labels, labels[list(duplicates)]])
    raw.mkdir(parents=True, exist_ok=True)
    np.savez(raw / "digits.npz", images=images, target=labels)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = raw / "digits_images" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{index:04d}.png")
    return images, labels


def tabular_rows(
    count: int,
    seed: int,
    *,
    shift: float = 0.0,
    colour_weights: Sequence[float] = (1.0, 1.0, 1.0),
) -> list[dict[str, Any]]:
    """Rows ``{id, x, colour, note}``: ``x`` ~ N(10 + shift, 2), colours by weight."""
    rng = np.random.default_rng(seed)
    weights = np.asarray(colour_weights, dtype=np.float64)
    colours = rng.choice(len(COLOURS), size=count, p=weights / weights.sum())
    words = ("calm", "bright", "river", "stone", "quiet", "meadow", "signal", "harbour")
    return [
        {
            "id": index,
            "x": round(float(rng.normal(10.0 + shift, 2.0)), 4),
            "colour": COLOURS[colours[index]],
            "note": " ".join(rng.choice(words, size=int(rng.integers(3, 9)))),
        }
        for index in range(count)
    ]


def write_tabular_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """``tabular_rows`` as a CSV file with a header line."""
    lines = ["id,x,colour,note"]
    lines.extend(f"{row['id']},{row['x']},{row['colour']},{row['note']}" for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tabular_spec(name: str, source: str = "table.csv") -> dict[str, Any]:
    """A spec for ``tabular_rows`` data with every field declared."""
    return {
        "name": name,
        "sources": [{"type": "csv", "path": source}],
        "infer_schema": False,
        "schema": {
            "id": {"type": "numeric", "dtype": "int64"},
            "x": {"type": "numeric"},
            "colour": {"type": "categorical"},
            "note": {"type": "text"},
        },
        "labels": ["colour"],
        "vocab": {"size": 64},
        "output": {"num_shards": {"train": 2, "validation": 1, "test": 1}},
    }


def write_tabular_dataset_inputs(
    directory: Path, name: str, rows: Sequence[dict[str, Any]]
) -> Path:
    """``table.csv`` plus ``<name>.yaml`` in ``directory``; returns the spec path."""
    write_tabular_csv(directory / "table.csv", rows)
    return write_spec(directory / f"{name}.yaml", tabular_spec(name))


def write_text_spec(directory: Path, texts: list[str], text: dict, **spec: Any) -> Path:
    """``texts`` as JSON Lines records ``{"id", "text"}`` and a spec that builds them
    as stored (no cleaning), split by id; ``text`` is the text field's schema and
    ``spec`` adds or replaces top-level keys."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": value}) for i, value in enumerate(texts)]
    (directory / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = {
        "name": "texts",
        "sources": [{"type": "jsonl", "path": "texts.jsonl"}],
        "infer_schema": False,
        "schema": {"id": {"type": "numeric", "dtype": "int64"}, "text": text},
        "clean": {"unicode_normalization": "none", "collapse_whitespace": False},
        "dedup": {"exact": {"fields": ["id"]}},
        "split": {"ratios": {"train": 0.8, "test": 0.2}, "key": "id"},
    }
    return write_spec(directory / "texts.yaml", {**base, **spec})


TICKET_QUEUES = ("billing", "outage", "account", "shipping")


def write_ticket_table(directory: Path, count: int = 2400, seed: int = 7) -> Path:
    """A support-ticket table as a help desk exports it, and a spec; the spec's path.

    Each row has free text (words of its queue among words of others and filler), the
    channel it came in on (a category that leans on the queue), an amount whose heavy
    tail reaches many standard deviations (billing tickets are larger), and two labels:
    the queue, and the hours waited (longer for shipping). Every kind of raw feature at
    once, with scales far apart.
    """
    rng = np.random.default_rng(seed)
    words = {
        "billing": "invoice charge refund payment card overcharged receipt price",
        "outage": "down error crash timeout unavailable broken slow server",
        "account": "password login reset email username locked profile access",
        "shipping": "package delivery tracking courier late address parcel arrived",
    }
    filler = [
        "please",
        "help",
        "hello",
        "thanks",
        "urgent",
        "today",
        "again",
        "still",
        "issue",
        "problem",
    ]
    channels = ("email", "phone", "chat")
    lines = ["id,text,channel,amount,wait_hours,queue"]
    for index in range(count):
        queue = int(rng.integers(len(TICKET_QUEUES)))
        own = rng.choice(words[TICKET_QUEUES[queue]].split(), size=int(rng.integers(1, 4)))
        other_queue = TICKET_QUEUES[int(rng.integers(len(TICKET_QUEUES)))]
        other = rng.choice(words[other_queue].split(), size=int(rng.integers(0, 3)))
        padding = rng.choice(filler, size=int(rng.integers(2, 8)))
        text = " ".join(rng.permutation(np.concatenate([own, other, padding])))
        channel = channels[(queue + int(rng.integers(0, 2))) % len(channels)]
        amount = round(float(rng.lognormal(3.0 + 1.5 * (queue == 0), 1.0)), 2)
        wait_hours = round(float(rng.exponential(5.0 + 20.0 * (queue == 3))), 1)
        lines.append(f"{index},{text},{channel},{amount},{wait_hours},{TICKET_QUEUES[queue]}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tickets.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = {
        "name": "tickets",
        "sources": [{"type": "csv", "path": "tickets.csv"}],
        "schema": {
            "id": {"type": "numeric", "dtype": "int64"},
            "text": {"type": "text"},
            "channel": {"type": "categorical"},
            "queue": {"type": "categorical"},
        },
        "labels": ["queue", "wait_hours"],
        "split": {"key": "id"},
    }
    return write_spec(directory / "tickets.yaml", spec)
