"""The ``analysis.yaml`` reference (``docs/reference/analysis-yaml.md``), generated from its models.

Every key of ``ops.analysis.AnalysisConfig`` (the canary analysis a rollout is judged
by) with its type, constraints, default and meaning, and the default PromQL queries in
full, so the reference cannot drift from what ``slipway canary start --analysis`` accepts:
``tests/docs/test_reference_pages.py`` fails when the committed page and this output
differ. Regenerate it with::

    python -m ops.analysis_reference > docs/reference/analysis-yaml.md

A key's meaning is its field's ``description`` when the model gives one, else the entry
for its field in ``DESCRIPTIONS`` below (``contracts.config_reference.describe``).
"""

from __future__ import annotations

import dataclasses

from contracts.config_reference import Key, config_keys, render_reference
from ops.analysis import (
    TEMPLATE_VARIABLES,
    AccuracyCheck,
    AnalysisConfig,
    Checks,
    CustomCheck,
    ErrorRateCheck,
    FailoverRateCheck,
    LatencyCheck,
    Queries,
    ShadowAgreementCheck,
    format_duration,
    parse_duration,
)

DESCRIPTIONS: dict[tuple[type, str], str] = {
    (AnalysisConfig, "window"): "how far back each measurement looks; longer gives more "
    "requests per verdict, shorter reacts faster",
    (AnalysisConfig, "min_requests"): "canary requests (or shadow comparisons) in the window "
    "before any verdict; also the stable observations a latency baseline needs",
    (AnalysisConfig, "confidence"): "of each analysis as a whole: a bound fails when its "
    "Holm-adjusted p-value is below 1 − confidence",
    (AnalysisConfig, "failure_limit"): "failing analyses in a row that roll back",
    (AnalysisConfig, "checks"): "the checks each analysis runs",
    (AnalysisConfig, "queries"): "the PromQL the Prometheus provider runs (not the scraper)",
    (Checks, "error_rate"): "errors per request (any code but OK); null: off",
    (Checks, "latency_p99"): "p99 latency from the request histogram; null: off",
    (Checks, "shadow_agreement"): "mirrored requests whose top-1 class matches stable's answer "
    "(shadow phase); null: off",
    (Checks, "failover_rate"): "canary requests retried on stable, per canary request; null: off",
    (Checks, "accuracy"): "live top-1 accuracy from label feedback; null: off",
    (Checks, "custom"): "extra PromQL checks (Prometheus only; the scraper skips them)",
    (ErrorRateCheck, "max_increase_points"): "fail on evidence of more than stable's rate + "
    "this many points (a non-inferiority margin)",
    (ErrorRateCheck, "max"): "fail on evidence of a rate above this, whatever stable does",
    (LatencyCheck, "max_ratio"): "canary p99 at most this × stable's …",
    (LatencyCheck, "max_added_ms"): "… + this many milliseconds",
    (LatencyCheck, "max_ms"): "absolute p99 bound in milliseconds",
    (ShadowAgreementCheck, "min"): "mean agreement needed, over at least min_requests comparisons",
    (FailoverRateCheck, "max_increase_points"): "fail on evidence of more than stable's error "
    "rate + this many points",
    (FailoverRateCheck, "max"): "absolute bound on the failover rate",
    (AccuracyCheck, "max_decrease_points"): "fail on evidence of less than stable's accuracy − "
    "this many points",
    (AccuracyCheck, "min_labels"): "labels each side needs in the window before the check is "
    "judged",
    (CustomCheck, "name"): "the check's name (letters, digits, _)",
    (CustomCheck, "query"): "a template returning one value, rendered for the canary",
    (CustomCheck, "max"): "the value must stay at or below this",
    (CustomCheck, "min"): "the value must stay at or above this (give max, min or both)",
    (Queries, "requests"): "requests per side",
    (Queries, "errors"): "errors per side",
    (Queries, "latency_buckets"): "latency histogram per side, one series per le",
    (Queries, "failovers"): "requests retried away from a version",
    (Queries, "shadow_agreement"): "mean agreement of mirrored requests (route shadow)",
    (Queries, "shadow_requests"): "mirrored requests compared",
    (Queries, "labelled"): "predictions whose true label came back",
    (Queries, "correct"): "… of which the top-1 class matched the label",
}

VARIABLES = ", ".join(f"`{{{name}}}`" for name in TEMPLATE_VARIABLES)
HEADER = f"""\
# analysis.yaml reference

Every key of a canary analysis file (`slipway canary start --analysis analysis.yaml`),
generated from the models in `ops/analysis.py` by

    python -m ops.analysis_reference > docs/reference/analysis-yaml.md

and checked by a test, so it cannot drift from what the rollout controller accepts. Every
key is optional: without a file, or with an empty one, a rollout is judged by the
defaults below. A duration is written as Prometheus writes one (`30s`, `1m30s`, `500ms`)
or as a number of seconds. Each analysis fills a PromQL template's variables in for the
side it measures:
{VARIABLES}.
"""


def analysis_keys() -> list[Key]:
    """Every key of the analysis file, durations and PromQL templates named as such."""
    return [_named(key) for key in config_keys(AnalysisConfig)]


def _named(key: Key) -> Key:
    validators = {getattr(item, "func", None) for item in key.field.metadata}
    if parse_duration in validators:
        default = f"`{format_duration(key.field.default)}`"
        return dataclasses.replace(key, type="duration", default=default)
    if key.declared_by is Queries:
        return dataclasses.replace(key, type="PromQL template", default="(below)")
    if key.owner is CustomCheck and key.name == "query":
        return dataclasses.replace(key, type="PromQL template")
    return key


def default_queries() -> list[str]:
    """Each default query in full, as Markdown."""
    lines = ["\n## Default queries\n"]
    for name, template in Queries().model_dump().items():
        lines += [f"`queries.{name}`:\n", "```text", template, "```\n"]
    return lines


def render() -> str:
    """The whole reference as Markdown: one table per section, then the default queries."""
    page = render_reference(HEADER, analysis_keys(), DESCRIPTIONS)
    return page + "\n".join(default_queries())


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
