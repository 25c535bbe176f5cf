"""What a finished build must pass before it is published.

A pipeline that ran to the end can still have produced something nobody should train
on: a header mistake quarantines every row, a misspelt label drops every record, an
empty file yields nothing, and a runner whose workers wrote somewhere else leaves no
output at all. Such a build is refused — ``BuildRejectedError`` — and the pipeline
discards its staging directory, so the destination, and a dataset already there, stay
as they were. The checks:

- **complete**: every file the workers write into the staging directory is there
  (side files are never replaced by defaults, which would publish empty shards);
- **no empty split**: every split of ``split.ratios`` holds at least one record;
- **bounded loss**: the share of the input records that were quarantined (unreadable,
  or not fitting the schema) or dropped by a clean rule is at most
  ``quality.max_quarantine_fraction``. Duplicates merged by de-duplication are not a
  loss: what they held is still in the dataset.
- **one spelling per category**, when ``quality.category_variants`` is ``refuse``: no
  categorical field holds values that differ only in case or spacing
  (research.data.category_checks);
- **every file read**: no source file failed as a whole. The checks before the build
  refuse such files; one that changed or vanished after them held records nobody
  counted, so the loss cannot be measured and the build is refused.

An empty split with a ``split.key`` is explained by the key's number of distinct
values: every record with one key goes to one split.

The numbers behind the verdict go into the report's ``quality`` section, and a refusal
names each rule that took records with a few of the records it took, from
``quarantine.jsonl`` and ``dropped.jsonl``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contracts.dataset_manifest import DatasetError
from research.data import filesystems
from research.data.rejects import DROPPED_FILE, QUARANTINE_FILE, read_entries
from research.data.spec import QualitySpec

# Counters the checks read from the report's rules; the readers (research.data.sources)
# and the split (research.data.split) count them.
UNREADABLE_FILES = "read.unreadable_files"  # source files that failed as a whole
DISTINCT_KEYS = "split_key.distinct_values"  # distinct split keys, up to DISTINCT_KEYS_CAP
DISTINCT_KEYS_CAP = 10_000

EXAMPLES_PER_RULE = 3
EXAMPLE_CHARS = 160  # of an example's raw record, in a refusal message
LOSS_ACTIONS = ("quarantined", "dropped")


class BuildRejectedError(DatasetError):
    """A build ran to the end but its result was refused; nothing was published.

    ``report`` is the build's data report when the pipeline got far enough to count.
    """

    def __init__(self, message: str, report: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report


def read_side_file(path: str) -> Any:
    """JSON a pipeline worker wrote; a refusal naming the file when it is not there."""
    try:
        return filesystems.read_json(path)
    except FileNotFoundError:
        raise BuildRejectedError(_missing(path)) from None
    except (OSError, ValueError) as exc:
        raise BuildRejectedError(f"{path}: unreadable output of a pipeline worker: {exc}") from None


def require_side_file(path: str) -> str:
    if not filesystems.exists(path):
        raise BuildRejectedError(_missing(path))
    return path


def _missing(path: str) -> str:
    return (
        f"{path}: missing after the pipeline finished. Its workers wrote their output "
        "somewhere else or lost it; a distributed runner needs the dataset's directory on "
        "storage every worker can reach."
    )


def assess(report: Mapping[str, Any], quality: QualitySpec) -> dict[str, Any]:
    """The report's ``quality`` section: the numbers the checks use and their verdict."""
    lost = report["records_quarantined"] + report["records_dropped"]
    inputs = report["inputs"]
    fraction = lost / inputs if inputs else 0.0
    empty = [split for split, count in report["records_written"].items() if count == 0]
    unreadable = _rule_count(report, UNREADABLE_FILES)
    return {
        "inputs": inputs,
        "lost": lost,
        "lost_fraction": fraction,
        "max_quarantine_fraction": quality.max_quarantine_fraction,
        "empty_splits": empty,
        "unreadable_files": unreadable,
        "passed": not empty and not unreadable and fraction <= quality.max_quarantine_fraction,
    }


def _rule_count(report: Mapping[str, Any], name: str) -> int:
    return sum(int(rule["count"]) for rule in report.get("rules", ()) if rule["rule"] == name)


def judge_categories(
    report: dict[str, Any], variants: list[str], rare: list[str], quality: QualitySpec
) -> None:
    """Add the category findings to ``report``: as warnings, or as a refusal."""
    report["warnings"] = [*variants, *rare]
    if variants and quality.category_variants == "refuse":
        report["quality"]["refused_category_variants"] = variants
        report["quality"]["passed"] = False


def check_build(report: Mapping[str, Any], staging: str, destination: str) -> None:
    """Refuse the build in ``staging`` unless its report's quality section passed.

    The logs must exist either way (they are part of a complete build); a refusal quotes
    them.
    """
    logs = [
        require_side_file(filesystems.join(staging, name))
        for name in (QUARANTINE_FILE, DROPPED_FILE)
    ]
    verdict = report["quality"]
    if verdict["passed"]:
        return
    lines = [f"{destination}: the build was refused and nothing was written there."]
    entries = [entry for log in logs for entry in _entries(log)]
    if verdict.get("unreadable_files"):
        lines.append(_unreadable(verdict["unreadable_files"]))
    if verdict["empty_splits"]:
        lines.append(f"- no records in split(s) {', '.join(map(repr, verdict['empty_splits']))}")
        if not report.get("inputs"):
            lines.append("- the sources held no records at all")
        keys = _rule_count(report, DISTINCT_KEYS)
        if keys:
            lines.append(_few_keys(keys, len(report["records_written"])))
    if verdict.get("refused_category_variants"):
        lines.extend(
            f"- {finding} (quality.category_variants: refuse)"
            for finding in verdict["refused_category_variants"]
        )
    if verdict["lost_fraction"] > verdict["max_quarantine_fraction"]:
        lines.append(
            f"- {verdict['lost']:,} of {verdict['inputs']:,} input records "
            f"({verdict['lost_fraction']:.1%}) were quarantined or dropped, more than "
            f"quality.max_quarantine_fraction = {verdict['max_quarantine_fraction']:g} allows"
        )
    losses = _losses(report["rules"], entries)
    if losses:
        lines.extend(["Records lost, by rule, with examples:", *losses])
    raise BuildRejectedError("\n".join(lines), report)


def _unreadable(files: int) -> str:
    """Why a build with source files that failed as a whole is refused."""
    return (
        f"- {files:,} source file(s) could not be read to the end, though they passed the "
        "checks before the build (did they change or vanish during it?): the records they "
        "hold were not counted, so what the build lost is unknown; quarantine.jsonl names them"
    )


def _few_keys(keys: int, splits: int) -> str:
    """Why a split key can leave a split empty."""
    counted = f"at least {keys:,}" if keys >= DISTINCT_KEYS_CAP else f"only {keys:,}"
    return (
        f"- split.key has {counted} distinct value(s) among the records, for {splits} splits: "
        "every record with one key value goes to one split, so a key with few values "
        "leaves splits empty. Use a key with many more values than there are splits "
        "(an id, not a class or a group), or remove split.key to split by content"
    )


def _entries(path: str) -> list[dict[str, Any]]:
    try:
        return read_entries(path)
    except DatasetError as exc:
        raise BuildRejectedError(str(exc)) from None


def _losses(rules: Iterable[Mapping[str, Any]], entries: list[dict[str, Any]]) -> list[str]:
    """Each rule that took records, most first, with a few of the records it took."""
    losses = sorted(
        (rule for rule in rules if rule["action"] in LOSS_ACTIONS),
        key=lambda rule: (-rule["count"], rule["rule"]),
    )
    lines = []
    for rule in losses:
        lines.append(f"- {rule['rule']}: {rule['count']:,} records {rule['action']}, e.g.")
        for entry in _examples(rule["rule"], entries):
            raw = str(entry.get("raw", ""))
            if len(raw) > EXAMPLE_CHARS:
                raw = raw[:EXAMPLE_CHARS] + "…"
            lines.append(f"    {entry['origin']}: {entry['reason']}: {raw}")
    return lines


def _examples(rule: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries a rule took: dropped ones name their rule; quarantined ones their stage and,
    for a schema rule (``conform.quarantined.<field>``), the field in their reason."""
    stage, _, rest = rule.partition(".")
    field = rest.removeprefix("quarantined.") if rest.startswith("quarantined.") else None

    def taken(entry: dict[str, Any]) -> bool:
        if "rule" in entry:
            return entry["rule"] == rule
        if entry.get("stage") != stage:
            return False
        return field is None or f"{field!r}" in str(entry.get("reason", ""))

    return [entry for entry in entries if taken(entry)][:EXAMPLES_PER_RULE]
