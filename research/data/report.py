"""The data report: what each rule of a build read, quarantined, dropped, masked or merged.

It is made from the pipeline's counters (research.data.records.count), so it is the
same on every runner, and it is written beside the manifest as ``report.json``. Its
``quality`` section holds the numbers research.data.quality judged the build on.
Every record it counts as quarantined is a line of ``quarantine.jsonl``, and every
record dropped or merged a line of ``dropped.jsonl``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from research.data.quality import assess
from research.data.spec import QualitySpec

REPORT_FILE = "report.json"

_ACTIONS = (
    ("read.records.", "read"),
    ("read.quarantined", "quarantined"),
    ("conform.quarantined.", "quarantined"),
    ("clean.dropped.", "dropped"),
    ("clean.masked.", "masked"),
    ("clean.records_masked", "masked"),
    ("dedup.", "merged"),
    ("split.", "written"),
)


def action_of(counter: str) -> str:
    for prefix, action in _ACTIONS:
        if counter.startswith(prefix):
            return action
    return "counted"


def build_report(
    counters: Mapping[str, int], split_records: Mapping[str, int], quality: QualitySpec
) -> dict[str, Any]:
    """Group raw counters by action and add the totals people look for first."""
    rules = [
        {"rule": name, "action": action_of(name), "count": int(value)}
        for name, value in sorted(counters.items())
        if value
    ]

    def total(action: str, prefix: str = "") -> int:
        return sum(
            r["count"] for r in rules if r["action"] == action and r["rule"].startswith(prefix)
        )

    report = {
        # Inputs: records read, plus what could not be read as a record at all.
        "inputs": total("read") + total("quarantined", "read."),
        "records_read": total("read"),
        "records_quarantined": total("quarantined"),
        "records_dropped": total("dropped"),
        "records_merged": total("merged"),
        "pii_replacements": total("masked", "clean.masked."),
        "records_written": {split: int(count) for split, count in split_records.items()},
        "rules": rules,
    }
    report["quality"] = assess(report, quality)
    return report


def render_report(report: Mapping[str, Any], title: str = "Data report") -> Table:
    table = Table(title=title)
    table.add_column("rule")
    table.add_column("action")
    table.add_column("count", justify="right")
    for rule in report["rules"]:
        table.add_row(rule["rule"], rule["action"], f"{rule['count']:,}")
    table.add_section()
    table.add_row("records read", "", f"{report['records_read']:,}")
    table.add_row("quarantined", "", f"{report['records_quarantined']:,}")
    table.add_row("dropped by rules", "", f"{report['records_dropped']:,}")
    table.add_row("merged as duplicates", "", f"{report['records_merged']:,}")
    for split, count in report["records_written"].items():
        table.add_row(f"written to {split}", "", f"{count:,}")
    quality = report["quality"]
    table.add_row(
        "lost (quarantined + dropped)",
        f"max {quality['max_quarantine_fraction']:.1%}",
        f"{quality['lost_fraction']:.1%}",
    )
    return table
