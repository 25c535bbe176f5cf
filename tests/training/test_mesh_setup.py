"""What training on a mesh or in pipeline stages refuses, and how it names it."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from contracts.yaml_config import ConfigError
from research.experiments import load_experiment
from research.experiments.config import MeshShape
from research.experiments.task import ExperimentTask
from research.models.placement import pipeline_stages
from tests.support.experiments import write_experiment
from training.distribution import WorkerRole
from training.errors import TrainingSetupError
from training.mesh import local_mesh
from training.mesh_trainer import check_mesh_setup
from training.trainer import Trainer


def task(tmp_path: Path, corpus_dataset: Path, mesh: dict | None, **overrides) -> ExperimentTask:
    settings = {
        "data__features": ["text"],
        "data__sequence_length": 16,
        "data__batch_size": 8,
        "heads": {"next_token": {"kind": "language_model"}},
        "model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 4, "ff_dim": 32},
        "distribution": {"mesh": mesh} if mesh is not None else {},
        **overrides,
    }
    return ExperimentTask(load_experiment(write_experiment(tmp_path, corpus_dataset, **settings)))


@pytest.mark.parametrize(
    ("mesh", "overrides", "workers", "precision", "message"),
    [
        (
            {"model": 3},
            {},
            1,
            "float32",
            "model.num_heads: 4 does not split over the mesh's model axis (3)",
        ),
        (
            {"batch": 3},
            {},
            1,
            "float32",
            "data.batch_size: 8 is not divisible by the mesh's batch axis (3)",
        ),
        (
            {"model": 2},
            {"model": {"type": "gpt", "num_heads": 2, "experts": {"num_experts": 3}}},
            1,
            "float32",
            "model.experts.num_experts: 3 does not split over the mesh's model axis (2)",
        ),
        ({"model": 2}, {}, 2, "float32", "cannot be combined with 2 workers"),
        (
            {"model": 2},
            {"training__gradient_accumulation": 2},
            1,
            "float32",
            "gradient_accumulation",
        ),
        ({"model": 2}, {}, 1, "mixed_float16", "precision mixed_float16 is not supported"),
        ({"model": 2}, {}, 1, "mixed_bfloat16", "precision mixed_bfloat16 is not supported"),
        ({"model": 2}, {"training__jit_compile": True}, 1, "float32", "jit_compile: true"),
    ],
    ids=["heads", "batch", "experts", "workers", "accumulation", "float16", "bfloat16", "xla"],
)
def test_what_a_mesh_cannot_do_is_a_setup_error_naming_the_key(
    tmp_path: Path, corpus_dataset: Path, mesh, overrides, workers, precision, message
) -> None:
    experiment = task(tmp_path, corpus_dataset, mesh, **overrides)
    with pytest.raises(TrainingSetupError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_mesh_setup(experiment, WorkerRole(0, workers), precision)


def test_a_mesh_larger_than_the_devices_of_a_started_runtime_is_a_setup_error() -> None:
    """Once TensorFlow has started, its CPU can no longer be split for a mesh."""
    import tensorflow as tf

    devices = len(tf.config.list_logical_devices("CPU"))  # starts the runtime
    wanted = MeshShape(batch=2, model=devices)
    with pytest.raises(
        TrainingSetupError,
        match=rf"2 x {devices} needs {2 * devices} CPU devices; this process has {devices}",
    ):
        local_mesh(wanted)


def test_the_mesh_is_not_part_of_what_a_run_was_trained_by(
    tmp_path: Path, corpus_dataset: Path
) -> None:
    """A run may resume on another mesh: its config hash leaves the distribution out."""
    on_mesh = task(tmp_path / "a", corpus_dataset, {"batch": 2, "model": 2}).config
    elsewhere = task(tmp_path / "b", corpus_dataset, {"model": 4}).config
    assert on_mesh.config_hash() == elsewhere.config_hash()
    wider = task(tmp_path / "c", corpus_dataset, {"model": 4}, data__batch_size=16).config
    assert wider.config_hash() != elsewhere.config_hash()


def test_mesh_and_pipeline_are_one_or_the_other(tmp_path: Path, corpus_dataset: Path) -> None:
    with pytest.raises(ConfigError, match="give mesh or pipeline, not both"):
        task(tmp_path, corpus_dataset, {"model": 2}, distribution__pipeline={"stages": 2})


def test_a_pipeline_refuses_to_compile_its_stages_for_one_device(
    tmp_path: Path, corpus_dataset: Path
) -> None:
    experiment = task(
        tmp_path, corpus_dataset, None, training__jit_compile=True, training__precision="float32"
    )
    with (
        pipeline_stages(["/device:CPU:0", "/device:CPU:0"]),
        pytest.raises(TrainingSetupError, match="a pipeline's blocks sit on several"),
    ):
        Trainer(experiment, tf.distribute.get_strategy(), WorkerRole(0, 1))


@pytest.mark.parametrize(
    ("mesh", "key"), [({"batch": 3}, "data.batch_size"), ({"model": 3}, "model.num_heads")]
)
def test_a_mesh_setup_error_names_the_experiment_file_and_line(
    tmp_path: Path, corpus_dataset: Path, mesh: dict, key: str
) -> None:
    """Like every config error: the file, the line of the key (or of its section when the
    file leaves it at its default), then the key."""
    from training.run import train

    tf.config.list_logical_devices("CPU")  # started: this worker's CPU is never split
    experiment = task(tmp_path, corpus_dataset, mesh)
    source = experiment.config.source
    with pytest.raises(TrainingSetupError) as raised:
        train(experiment, progress=False)
    message = str(raised.value)
    where, line, rest = message.split(":", 2)
    assert where == source
    text = Path(source).read_text().splitlines()
    section, _, name = rest.strip().partition(":")[0].rpartition(".")
    # The line of the key the message names, else of its section.
    expected = next(
        (n for n, row in enumerate(text, 1) if row.strip().startswith(f"{name}:")),
        next(n for n, row in enumerate(text, 1) if row.startswith(f"{section.split('.')[0]}:")),
    )
    assert int(line) == expected, (message, text)
    assert rest.strip().startswith(("distribution.mesh", key)), message


def test_located_leaves_messages_without_a_key_or_a_file_as_they_are(tmp_path: Path) -> None:
    from contracts.yaml_config import located

    config = tmp_path / "e.yaml"
    config.write_text("data:\n  batch_size: 8\nmodel:\n  type: gpt\n")
    assert (
        located("data.batch_size: 8 is odd", str(config))
        == f"{config}:2: data.batch_size: 8 is odd"
    )
    assert located("model.num_heads: 4", str(config)) == f"{config}:3: model.num_heads: 4"
    assert located("a sentence, no key", str(config)) == "a sentence, no key"
    assert located("data.batch_size: 8", None) == "data.batch_size: 8"
    assert located("data.x: y", str(tmp_path / "gone.yaml")) == "data.x: y"


def test_a_model_with_a_subclassed_part_is_refused_for_a_mesh_and_a_functional_one_is_not() -> None:
    import tf_keras as keras

    from training.mesh_trainer import check_mesh_model

    class Gated(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(4)
            self.gate = keras.layers.Dense(4, activation="sigmoid")

        def call(self, inputs: tf.Tensor) -> tf.Tensor:
            return self.hidden(inputs) * self.gate(inputs)

    inputs = keras.Input((3,), name="x")
    functional = keras.Model(inputs, keras.layers.Dense(2, name="y")(inputs))
    check_mesh_model(functional)
    check_mesh_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    wrapped = keras.Model(inputs, keras.layers.Dense(2)(Gated()(inputs)))  # as conform wraps it
    for model in (Gated(), wrapped):
        with pytest.raises(
            TrainingSetupError, match=r"^model\.build: a subclassed Keras model \(Gated\)"
        ):
            check_mesh_model(model)
