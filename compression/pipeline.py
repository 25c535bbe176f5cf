"""One compression run: methods in, measured and gated results out, the winner published.

The order is chosen so that bad input costs nothing and publishes nothing: method names
and the publish choice are checked first, then the source version and the dataset
against each other, and only then do methods run. Every result is compared like for
like with the float32 TFLite conversion of the same model, the file it would replace:
the same held-out examples, the same LiteRT runner and threads, batch-1 latencies timed
in interleaved rounds. A result that loses more than the allowed accuracy against that
conversion is marked failed (the conversion itself is judged against the source
SavedModel), the report is written, and only a passing result can become a new version
in the repository.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tf_keras as keras

from compression import clustering, pruning, ptq, qat
from compression import distill as distillation
from compression.converter_log import logging_to
from compression.errors import CompressionError
from compression.evaluate import (
    EvalData,
    EvalSettings,
    Evaluation,
    cpu_description,
    evaluate_saved_model,
    evaluate_tflite_models,
    load_eval_data,
)
from compression.finetune import (
    DEFAULT_EPOCHS,
    TrainingData,
    infer_heads,
    open_dataset,
    training_data,
)
from compression.int8_choice import Judge, choose_int8
from compression.loading import LoadedModel, load_version, read_signature
from compression.methods import (
    DEFAULT_ALPHA,
    DEFAULT_TEMPERATURE,
    INTEGER_METHODS,
    METHOD_NAMES,
    THEN_METHODS,
)
from compression.publish import Source, publish_compressed
from compression.quality_gate import QualityGate
from compression.report import BASELINE, PASSED, Report, ReportFiles, Row, write_report
from compression.result import CompressedModel
from compression.strip import strip_for_serving
from contracts.model_manifest import validate_model_name
from contracts.serving_contract import ContractChangeError

REFERENCE_METHOD = "float32"
AUTO = "auto"
VALIDATION_SPLIT = "validation"
JUDGE_EXAMPLES = 1000  # enough to resolve a 1-point drop, few enough to be quick
CONVERTER_LOG = "converter.log"  # beside the report: what the TFLite converter printed

Progress = Callable[[str], None]


def parse_methods(text: str | Sequence[str]) -> list[str]:
    """``"int8,prune"`` (or a list) -> known method names in order, without repeats."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise CompressionError(f"--method: no method given; choose from {', '.join(METHOD_NAMES)}")
    unknown = [name for name in names if name not in METHOD_NAMES]
    if unknown:
        raise CompressionError(
            f"--method: unsupported compression method {unknown[0]!r}; "
            f"choose from {', '.join(METHOD_NAMES)}"
        )
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class MethodOptions:
    """Settings of the methods themselves (the defaults are the methods' own)."""

    epochs: int = DEFAULT_EPOCHS
    target_sparsity: float = 0.5
    clusters: int = 16
    calibration_samples: int = ptq.DEFAULT_SAMPLES
    seed: int = 0
    verbose: int = 0  # Keras progress bars while fine-tuning
    student: Path | None = None  # the student experiment of ``distill``
    then: str | None = None  # what ``distill`` applies to its student afterwards
    temperature: float = DEFAULT_TEMPERATURE
    alpha: float = DEFAULT_ALPHA


class MethodRunner:
    """Runs methods on one source model, sharing what several of them need.

    The training batches and the calibration samples are built once, on first use:
    retraining methods share one training pipeline, and a run of post-training methods
    never builds it.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        dataset_dir: Path,
        options: MethodOptions,
        gate: QualityGate | None = None,
    ) -> None:
        self.model = loaded.model
        self.signature = loaded.signature
        self.heads = infer_heads(loaded.model, loaded.manifest.get("labels"))
        self.dataset_dir = dataset_dir
        self.options = options
        self.gate = gate or QualityGate()
        self._train: TrainingData | None = None
        self._representative: list | None = None
        self._float32: CompressedModel | None = None
        self._judge: Judge | None = None

    def train(self) -> TrainingData:
        if self._train is None:
            self._train = training_data(self.dataset_dir, self.model, self.heads)
        return self._train

    def representative(self) -> list:
        if self._representative is None:
            self._representative = ptq.representative_dataset(
                self.dataset_dir,
                self.model,
                num_samples=self.options.calibration_samples,
                seed=self.options.seed,
            )
        return self._representative

    def float32(self) -> CompressedModel:
        if self._float32 is None:
            self._float32 = ptq.float32(self.model)
        return self._float32

    def judge(self) -> Judge:
        """How int8 schemes are chosen: on the validation split (the training split when
        there is none), never the test split the report is measured on."""
        if self._judge is None:
            splits = open_dataset(self.dataset_dir, "train").splits
            split = VALIDATION_SPLIT if VALIDATION_SPLIT in splits else "train"
            data = load_eval_data(
                self.dataset_dir, self.signature, split, max_examples=JUDGE_EXAMPLES
            )
            self._judge = Judge(data, self.float32().tflite, self.gate)
        return self._judge

    def _retrain(self, method: str) -> CompressedModel:
        options = self.options
        common = {
            "heads": self.heads,
            "epochs": options.epochs,
            "seed": options.seed,
            "verbose": options.verbose,
        }
        if method in ("prune", "prune_2_4"):
            return pruning.prune(
                self.model,
                self.train(),
                target_sparsity=options.target_sparsity,
                structured_2_4=method == "prune_2_4",
                **common,
            )
        if method == "qat":
            return qat.quantize_aware(self.model, self.train(), **common)
        if method == "prune_qat":
            return qat.prune_quantize_aware(
                self.model, self.train(), target_sparsity=options.target_sparsity, **common
            )
        if method == "cluster":
            return clustering.cluster(
                self.model, self.train(), number_of_clusters=options.clusters, **common
            )
        if method == "distill":
            return self._distill()
        raise CompressionError(f"unsupported compression method {method!r}")

    def _distill(self) -> CompressedModel:
        """The student in float32, or quantized by ``then`` (its row is named after both)."""
        options = self.options
        if options.student is None:
            raise CompressionError("distill needs --student, the student experiment file")
        student = distillation.distill(
            self.model,
            self.train(),
            distillation.Student.load(options.student),
            heads=self.heads,
            temperature=options.temperature,
            alpha=options.alpha,
            seed=options.seed,
            verbose=options.verbose,
        )
        if options.then is None:
            return student
        assert student.keras_model is not None
        # The int8 schemes are judged against the student's own float32 conversion.
        judge = replace(self.judge(), float_tflite=student.tflite)
        quantized = choose_int8(student.keras_model, self.representative(), judge)
        return CompressedModel(
            f"distill+{options.then}",
            quantized.tflite,
            None,
            {"distill": student.details, options.then: quantized.details},
        )

    def run(self, method: str) -> CompressedModel:
        """The result of ``method``, named after it, its flatbuffer stripped for serving.

        Every result is stripped alike, the float32 reference included, so a size ratio
        says what the method saves and not what stripping does; the converter's own
        size is recorded in the details as ``converter_bytes``.
        """
        result = self._compress(method)
        details = {**result.details, "converter_bytes": len(result.tflite)}
        return replace(result, tflite=strip_for_serving(result.tflite), details=details)

    def _compress(self, method: str) -> CompressedModel:
        """The result as the method's own code returns it, as converted."""
        if method == "float32":
            result = self.float32()
        elif method == "dynamic_range":
            result = ptq.dynamic_range(self.model)
        elif method == "float16":
            result = ptq.float16(self.model)
        elif method == "int8":
            result = choose_int8(self.model, self.representative(), self.judge())
        elif method == "int8_io":
            # Integer-only accelerators need every op int8: no float fallback here.
            result = ptq.full_integer(self.model, self.representative(), int8_io=True)
        else:
            result = self._retrain(method)
        if method == "distill":
            return result  # named after what was applied to the student too
        return replace(result, method=method)


@dataclass(frozen=True)
class CompressOptions:
    """What to run and how to judge it.

    ``methods`` always gain the float32 TFLite conversion first: it is the reference the
    size ratios are taken against and a check that conversion alone loses nothing.
    ``publish`` is None (do not publish), ``"auto"`` (the smallest passing integer
    result) or a method name.
    """

    methods: Sequence[str]
    max_accuracy_drop: float = 1.0
    max_error_increase: float = 2.0
    split: str = "test"
    settings: EvalSettings = field(default_factory=EvalSettings)
    method_options: MethodOptions = field(default_factory=MethodOptions)
    publish: str | None = None
    repository: Path | None = None
    model_name: str | None = None
    allow_contract_change: bool = False

    @property
    def gate(self) -> QualityGate:
        return QualityGate(self.max_accuracy_drop, self.max_error_increase)

    def __post_init__(self) -> None:
        methods = parse_methods(self.methods)
        object.__setattr__(self, "methods", [REFERENCE_METHOD] + [
            name for name in methods if name != REFERENCE_METHOD
        ])  # fmt: skip
        distilling = "distill" in self.methods
        if distilling and self.method_options.student is None:
            raise CompressionError("--method distill needs --student STUDENT_EXPERIMENT.yaml")
        if distilling:
            distillation.Student.load(self.method_options.student)  # bad files fail first
        if not distilling and self.method_options.student is not None:
            raise CompressionError("--student is only used by --method distill")
        if self.method_options.then is not None and not distilling:
            raise CompressionError("--then applies to --method distill only")
        if self.method_options.then not in (None, *THEN_METHODS):
            raise CompressionError(
                f"--then {self.method_options.then}: choose from {', '.join(THEN_METHODS)}"
            )
        _ = self.gate  # building it refuses negative limits
        if self.model_name is not None:
            try:
                validate_model_name(self.model_name)
            except ValueError as exc:
                raise CompressionError(f"--name: {exc}") from None
        if self.publish is None:
            return
        if self.repository is None:
            raise CompressionError("--publish needs --out, the model repository to publish into")
        if self.publish != AUTO and self.publish not in self.methods:
            raise CompressionError(
                f"--publish {self.publish}: that method is not among those run "
                f"({', '.join(self.methods)})"
            )
        if self.publish == AUTO and not set(INTEGER_METHODS) & set(self.methods):
            raise CompressionError(
                f"--publish without a method picks the smallest passing integer result, but "
                f"none of {', '.join(INTEGER_METHODS)} is run; name the method to publish"
            )


@dataclass
class Outcome:
    compressed: CompressedModel
    row: Row


@dataclass
class CompressionRun:
    """What a run produced. ``refusal`` says why nothing was published when asked to."""

    source: Source
    data: EvalData
    baseline: Evaluation
    outcomes: dict[str, Outcome]
    report: Report
    files: ReportFiles
    published: tuple[int, Path] | None = None
    refusal: str | None = None


def choose(outcomes: dict[str, Outcome], wanted: str) -> tuple[Outcome | None, str | None]:
    """The outcome to publish, or why there is none."""
    if wanted != AUTO:
        outcome = outcomes[wanted]
        if outcome.row.status != PASSED:
            return None, f"{wanted} failed the quality gate ({outcome.row.note}); not published"
        return outcome, None
    passing = [
        outcomes[name] for name in INTEGER_METHODS
        if name in outcomes and outcomes[name].row.status == PASSED
    ]  # fmt: skip
    if not passing:
        return None, "no integer result passed the quality gate; nothing published"
    return min(passing, key=lambda outcome: outcome.row.evaluation.size_bytes), None


def compress(
    model_dir: str | Path,
    dataset_dir: str | Path,
    options: CompressOptions,
    report_dir: str | Path,
    *,
    progress: Progress = lambda message: None,
) -> CompressionRun:
    """Run ``options.methods`` on the source version and report (and publish) the results.

    The TFLite converter's own output goes to ``converter.log`` in ``report_dir``."""
    with logging_to(Path(report_dir) / CONVERTER_LOG):
        return _compress_and_report(model_dir, dataset_dir, options, report_dir, progress)


def _compress_and_report(
    model_dir: str | Path,
    dataset_dir: str | Path,
    options: CompressOptions,
    report_dir: str | Path,
    progress: Progress,
) -> CompressionRun:
    model_dir, dataset_dir = Path(model_dir), Path(dataset_dir)
    # Every model built here (pruning and quantization wrappers, fine-tuning) computes in
    # float32, whatever policy a training run earlier in this process left behind.
    keras.mixed_precision.set_global_policy("float32")
    progress(f"loading {model_dir}")
    loaded: LoadedModel = load_version(model_dir)
    source = Source(model_dir, loaded)
    data_manifest = open_dataset(dataset_dir, options.split)
    data = load_eval_data(
        dataset_dir, loaded.signature, options.split, max_examples=options.settings.max_examples
    )
    served = data
    if loaded.raw_inputs:  # the served graph preprocesses: it reads what clients send
        served = load_eval_data(
            dataset_dir,
            read_signature(model_dir),
            options.split,
            max_examples=options.settings.max_examples,
            raw=True,
        )
    progress(f"measuring the float32 baseline on {data.num_examples} {options.split} examples")
    baseline = evaluate_saved_model(model_dir, served, settings=options.settings)
    rows = [Row("float32", "SavedModel", baseline, BASELINE)]
    runner = MethodRunner(loaded, dataset_dir, options.method_options, options.gate)
    compressed_models: dict[str, CompressedModel] = {}
    for method in options.methods:
        progress(f"{method}: compressing")
        try:
            compressed_models[method] = runner.run(method)
        except CompressionError as exc:
            raise CompressionError(f"{method}: {exc}") from None
    progress(f"measuring {', '.join(options.methods)} side by side")
    evaluations = evaluate_tflite_models(
        {method: result.tflite for method, result in compressed_models.items()},
        data,
        reference=REFERENCE_METHOD,
        settings=options.settings,
    )
    outcomes: dict[str, Outcome] = {}
    for method, compressed in compressed_models.items():
        evaluation = evaluations[method]
        # Conversion is judged against the SavedModel; every method against the conversion.
        against = baseline if method == REFERENCE_METHOD else evaluations[REFERENCE_METHOD]
        status, drop, note = options.gate.judge(against, evaluation)
        row = Row(compressed.method, "TFLite", evaluation, status, drop, compressed.details, note)
        outcomes[method] = Outcome(compressed, row)
        rows.append(row)
    report = Report(
        model={"name": source.name, "version": source.version, "path": str(model_dir.resolve())},
        dataset=str(dataset_dir.resolve()),
        split=options.split,
        max_accuracy_drop=options.max_accuracy_drop,
        max_error_increase=options.max_error_increase,
        settings=options.settings,
        rows=rows,
        size_reference=REFERENCE_METHOD,
        machine=cpu_description(),
    )
    files = write_report(report, report_dir)
    run = CompressionRun(source, data, baseline, outcomes, report, files)
    if options.publish is None:
        return run
    chosen, run.refusal = choose(outcomes, options.publish)
    if chosen is None:
        return run
    method = chosen.compressed.method
    progress(f"{method}: publishing into {options.repository}")
    try:
        run.published = publish_compressed(
            chosen.compressed,
            chosen.row.evaluation,
            source=source,
            data_manifest=data_manifest,
            dataset_dir=dataset_dir,
            split=options.split,
            repository=options.repository,
            model_name=options.model_name,
            compression=_gate_record(chosen.row, options, files),
            allow_contract_change=options.allow_contract_change,
        )
    except ContractChangeError as exc:
        run.refusal = f"{method}: {exc}"
        return run
    version, path = run.published
    run.report = replace(
        report, published={"method": method, "version": version, "path": str(path)}
    )
    run.files = write_report(run.report, report_dir)
    return run


def _gate_record(row: Row, options: CompressOptions, files: ReportFiles) -> dict[str, Any]:
    return {
        "accuracy_drop_points": row.accuracy_drop,
        "max_accuracy_drop_points": options.max_accuracy_drop,
        "max_error_increase_percent": options.max_error_increase,
        "report": str(files.json.resolve()),
    }
