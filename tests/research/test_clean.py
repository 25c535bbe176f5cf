"""Cleaning rules: normalisation, required fields, length bounds and PII masking."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from contracts.yaml_config import ConfigError
from research.data.clean import CleanRecords, clean_record, compile_rules
from research.data.records import DROPPED_TAG, METRICS_NAMESPACE
from research.data.runners import IN_PROCESS_RUNNER as RUNNER
from research.data.spec import CleanSpec, FieldSchema

SCHEMA = {
    "text": FieldSchema(type="text"),
    "title": FieldSchema(type="text"),
    "topic": FieldSchema(type="categorical"),
    "score": FieldSchema(type="numeric"),
}


def rules(required: list[str] | None = None, **clean: object):
    return compile_rules(CleanSpec.model_validate(clean), SCHEMA, required or [])


def record(**fields: object) -> dict:
    return {"text": "some text", "title": "a title", "topic": "news", "score": 1.0, **fields}


# --------------------------------------------------------------------------- pure rules


def test_nfkc_folds_compatibility_forms_in_text_and_categorical_fields() -> None:
    cleaned = clean_record(record(text="ＡＢＣ １２３ ﬁne", topic="Ｎｅｗｓ"), rules()).record
    assert cleaned["text"] == "ABC 123 fine"
    assert cleaned["topic"] == "News"


def test_nfc_composes_but_keeps_compatibility_forms() -> None:
    cleaned = clean_record(record(text="cafe\u0301 ﬁne"), rules(unicode_normalization="NFC"))
    assert cleaned.record["text"] == "caf\u00e9 ﬁne"


def test_no_normalisation_leaves_characters_alone() -> None:
    text = "cafe\u0301 ＡＢＣ"
    cleaned = clean_record(record(text=text), rules(unicode_normalization="none"))
    assert cleaned.record["text"] == text


def test_whitespace_is_collapsed_and_stripped() -> None:
    cleaned = clean_record(record(text="  two\t\tspaces\n and\u00a0more  "), rules()).record
    assert cleaned["text"] == "two spaces and more"


def test_whitespace_is_kept_when_collapsing_is_off() -> None:
    text = "  two\t\tspaces "
    cleaned = clean_record(record(text=text), rules(collapse_whitespace=False)).record
    assert cleaned["text"] == text


def test_numbers_and_bookkeeping_keys_pass_through_and_input_is_not_modified() -> None:
    original = record(text="  x  ", _rank="0000|a|1", _origin="a:1")
    cleaned = clean_record(original, rules()).record
    assert cleaned == {**original, "text": "x"}
    assert original["text"] == "  x  "


@pytest.mark.parametrize("value", [None, "", "   \t "])
def test_required_text_missing_or_blank_drops_the_record(value: object) -> None:
    outcome = clean_record(record(text=value), rules(required=["text"]))
    assert outcome.record is None
    assert outcome.dropped_by == "clean.dropped.required.text"


def test_required_numeric_field_missing_drops_the_record() -> None:
    outcome = clean_record(record(score=None), rules(required=["score"]))
    assert outcome.dropped_by == "clean.dropped.required.score"
    assert clean_record(record(score=0.0), rules(required=["score"])).record is not None


def test_spec_required_fields_count_too() -> None:
    outcome = clean_record(
        record(topic=None), compile_rules(CleanSpec(required=["topic"]), SCHEMA, [])
    )
    assert outcome.dropped_by == "clean.dropped.required.topic"


def test_length_bounds_are_measured_after_normalisation() -> None:
    bounds = rules(length={"text": {"min": 3, "max": 5}})
    assert clean_record(record(text="  a   b  "), bounds).record["text"] == "a b"
    assert clean_record(record(text=" a  "), bounds).dropped_by == "clean.dropped.too_short.text"
    assert clean_record(record(text="abcdef"), bounds).dropped_by == "clean.dropped.too_long.text"
    # Full-width letters count as one character each, like their NFKC forms.
    assert clean_record(record(text="ＡＢＣ"), bounds).record["text"] == "ABC"


def test_missing_optional_values_are_not_measured() -> None:
    outcome = clean_record(record(title=None), rules(length={"title": {"min": 3}}))
    assert outcome.record is not None


def test_pii_is_masked_in_every_text_field_by_default_but_not_categorical() -> None:
    outcome = clean_record(
        record(text="mail a@example.com", title="call 415-555-0134", topic="b@example.com"),
        rules(),
    )
    assert outcome.record["text"] == "mail [EMAIL]"
    assert outcome.record["title"] == "call [PHONE]"
    assert outcome.record["topic"] == "b@example.com"
    assert outcome.masked == {"email": 1, "phone": 1}


def test_pii_fields_and_kinds_can_be_chosen() -> None:
    chosen = rules(pii={"fields": ["topic"], "kinds": ["email"]})
    outcome = clean_record(
        record(text="mail a@example.com", topic="b@example.com 10.0.0.1"), chosen
    )
    assert outcome.record["text"] == "mail a@example.com"
    assert outcome.record["topic"] == "[EMAIL] 10.0.0.1"


def test_pii_masking_can_be_disabled() -> None:
    outcome = clean_record(record(text="mail a@example.com"), rules(pii={"enabled": False}))
    assert outcome.record["text"] == "mail a@example.com"
    assert outcome.masked == {}


@pytest.mark.parametrize(
    ("required", "clean", "message"),
    [
        (["missing"], {}, "required: no field named 'missing'"),
        ([], {"length": {"score": {"min": 1}}}, "'score' must be text or categorical"),
        ([], {"length": {"text": {"min": 9, "max": 3}}}, "max 3 is below min 9"),
        ([], {"pii": {"fields": ["nope"]}}, "clean.pii.fields: no field named 'nope'"),
    ],
)
def test_rules_that_cannot_apply_are_config_errors(
    required: list[str], clean: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        rules(required=required, **clean)


# --------------------------------------------------------------------------- pipeline


def counters(result: beam.runners.runner.PipelineResult) -> dict[str, int]:
    query = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))
    return {counter.key.metric.name: counter.committed for counter in query["counters"]}


def test_pipeline_cleans_drops_and_counts_each_rule() -> None:
    inputs = [
        record(text="  keep   me  ", _rank="1"),
        record(text=None, _rank="2"),
        record(text="   ", _rank="3"),
        record(text="ab", _rank="4"),
        record(text="x" * 61, _rank="5"),
        record(text="mail a@example.com or b@example.com, call 415-555-0134", _rank="6"),
        record(text="server 10.0.0.1", title="card 4111 1111 1111 1111", _rank="7"),
    ]
    spec = CleanSpec.model_validate({"length": {"text": {"min": 3, "max": 60}}})
    pipeline = TestPipeline(runner=RUNNER)
    outputs = pipeline | beam.Create(inputs) | CleanRecords(spec, SCHEMA, ["text"])
    assert_that(
        outputs[DROPPED_TAG] | beam.Map(lambda entry: (entry["rule"], entry["reason"])),
        equal_to(
            [
                ("clean.dropped.required.text", "required field 'text' has no value"),
                ("clean.dropped.required.text", "required field 'text' has no value"),
                (
                    "clean.dropped.too_short.text",
                    "field 'text' has 2 characters, clean.length.text.min is 3",
                ),
                (
                    "clean.dropped.too_long.text",
                    "field 'text' has 61 characters, clean.length.text.max is 60",
                ),
            ]
        ),
        label="Dropped",
    )
    assert_that(
        outputs.records | beam.Map(lambda r: (r["_rank"], r["text"], r["title"])),
        equal_to(
            [
                ("1", "keep me", "a title"),
                ("6", "mail [EMAIL] or [EMAIL], call [PHONE]", "a title"),
                ("7", "server [IPV4]", "card [CARD]"),
            ]
        ),
    )
    result = pipeline.run()
    result.wait_until_finish()
    assert counters(result) == {
        "clean.dropped.required.text": 2,
        "clean.dropped.too_short.text": 1,
        "clean.dropped.too_long.text": 1,
        "clean.masked.email": 2,
        "clean.masked.phone": 1,
        "clean.masked.ipv4": 1,
        "clean.masked.card": 1,
        "clean.records_masked": 2,
    }


def test_misconfigured_rules_fail_before_the_pipeline_runs() -> None:
    with pytest.raises(ConfigError):
        CleanRecords(CleanSpec(), SCHEMA, ["nope"])


def test_a_dropped_record_is_logged_with_its_personal_data_masked() -> None:
    spec = CleanSpec.model_validate({"length": {"text": {"max": 30}}})
    inputs = [
        record(text="write to jane@example.com about the long overdue invoice", _origin="a:3")
    ]
    pipeline = TestPipeline(runner=RUNNER)
    outputs = pipeline | beam.Create(inputs) | CleanRecords(spec, SCHEMA, [])
    assert_that(
        outputs[DROPPED_TAG] | beam.Map(lambda entry: (entry["origin"], entry["raw"])),
        equal_to(
            [
                (
                    "a:3",
                    "{'text': 'write to [EMAIL] about the long overdue invoice', "
                    "'title': 'a title', 'topic': 'news', 'score': 1.0}",
                )
            ]
        ),
    )
    pipeline.run().wait_until_finish()
