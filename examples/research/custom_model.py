"""Train your own Keras model with Slipway, survive a crash, and serve it.

What it shows: a subclassed tf_keras model with a custom layer, trained on scikit-learn's
8x8 digits through Slipway's Task and ``train`` API, with checkpoints. The training
process is killed with SIGKILL once a checkpoint is committed, and a rerun resumes to
the same final step. The model is then published to a model repository, served by
the Slipway gateway, and called with TensorFlow Serving's own gRPC client.

    python examples/research/custom_model.py [--workdir out/custom-model]

Everything is written under the work directory: the dataset, the run's checkpoints and
logs, the model repository. The same model also trains from a config file, with
``custom_model.yaml`` next to this file naming the same function:

    slipway train examples/research/custom_model.yaml
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tf_keras as keras  # Keras 2: Slipway's compression tools need it (never `import keras`)

from research.models import HeadSpec, InputSpec

HERE = Path(__file__).resolve().parent
EXPERIMENT = HERE / "custom_model.yaml"
DEFAULT_WORKDIR = HERE.parents[1] / "out" / "custom-model"

# ## 1. A custom layer
#
# A layer is worth writing when a block of computation repeats. This one is a pre-norm
# residual MLP block: x + Dropout(Dense(GELU(Dense(LayerNorm(x))))).
#
# Registering it and giving it a `get_config` that returns its constructor arguments
# lets Keras rebuild it from a saved model, `clone_model` and `from_config` without
# being handed the class.


@keras.saving.register_keras_serializable(package="custom_model")
class ResidualBlock(keras.layers.Layer):
    """A pre-norm two-layer MLP whose output is added to its input."""

    def __init__(self, hidden_units: int, dropout: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden_units = hidden_units
        self.dropout = dropout
        self.norm = keras.layers.LayerNormalization()
        self.expand = keras.layers.Dense(hidden_units, activation="gelu")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape: Any) -> None:
        # The projection back to the input width can only be made once the width is known.
        self.project = keras.layers.Dense(input_shape[-1])
        super().build(input_shape)

    def call(self, x: Any, training: bool | None = None) -> Any:
        return x + self.drop(self.project(self.expand(self.norm(x))), training=training)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "hidden_units": self.hidden_units, "dropout": self.dropout}


# ## 2. A subclassed model
#
# Slipway calls a model with a dict of features keyed by their dataset names, so `call`
# reads its input by name. A classification head outputs class probabilities (softmax):
# that is what the loss Slipway pairs with a classification head expects.


@keras.saving.register_keras_serializable(package="custom_model")
class DigitClassifier(keras.Model):
    """Flattened pixels -> a dense embedding -> residual blocks -> class probabilities."""

    def __init__(
        self,
        feature: str,
        num_classes: int,
        width: int = 64,
        depth: int = 2,
        dropout: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.feature = feature
        self.num_classes = num_classes
        self.width = width
        self.depth = depth
        self.dropout = dropout
        self.flatten = keras.layers.Flatten()
        self.embed = keras.layers.Dense(width, activation="gelu")
        self.blocks = [ResidualBlock(2 * width, dropout, name=f"block_{i}") for i in range(depth)]
        self.norm = keras.layers.LayerNormalization()
        self.classify = keras.layers.Dense(num_classes, activation="softmax")

    def call(self, features: dict[str, Any], training: bool | None = None) -> Any:
        x = self.embed(self.flatten(features[self.feature]))
        for block in self.blocks:
            x = block(x, training=training)
        return self.classify(self.norm(x))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "feature": self.feature,
            "num_classes": self.num_classes,
            "width": self.width,
            "depth": self.depth,
            "dropout": self.dropout,
        }


# ## 3. The model function
#
# Slipway builds a model by calling a function with the dataset's inputs and heads
# (named specs: kind, shape, dtype, number of classes...). Here it is passed to the Task
# as `model_fn`; `custom_model.yaml` names it as `build: custom_model.py:build_classifier`
# with `args` for the keyword arguments. Slipway then fits whatever it returns to the
# dataset: this subclassed model gets `keras.Input`s named after the features and an
# output named after the head, so the exported SavedModel speaks the dataset's names.


def build_classifier(
    inputs: dict[str, InputSpec],
    heads: dict[str, HeadSpec],
    *,
    width: int = 64,
    depth: int = 2,
    dropout: float = 0.1,
) -> keras.Model:
    """A DigitClassifier for a dataset of one image feature and one classification label."""
    if len(inputs) != 1 or len(heads) != 1:
        raise ValueError(
            f"expected one input and one head. Received: inputs={list(inputs)}, heads={list(heads)}"
        )
    (feature,) = inputs
    (head,) = heads.values()
    return DigitClassifier(
        feature, head.num_classes, width=width, depth=depth, dropout=dropout, name="digits"
    )


# ## 4. The data
#
# scikit-learn ships the digits; the dataset spec `examples/data/digits.yaml` says how to
# turn them into TFRecord shards with a manifest (schema, splits, checksums).


def build_digits_dataset(workdir: Path) -> Path:
    """The digits as a Slipway dataset under ``workdir/datasets/digits``."""
    from sklearn.datasets import load_digits

    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    raw = workdir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    np.savez(raw / "digits.npz", images=images, target=digits.target)
    shutil.copy(HERE.parent / "data" / "digits.yaml", raw / "digits.yaml")
    output = workdir / "datasets" / "digits"
    build_dataset(load_spec(raw / "digits.yaml"), output, overwrite=True)
    return output


# ## 5. The experiment
#
# The YAML file holds everything but the model code: data, optimizer, steps, checkpoint
# cadence, where to publish. Its paths are relative to it; here they move into the
# work directory.


def load_config(workdir: Path) -> Any:
    from research.experiments import load_experiment

    config = load_experiment(EXPERIMENT)
    return config.model_copy(
        update={
            "data": config.data.model_copy(update={"dataset": str(workdir / "datasets/digits")}),
            "run_dir": str(workdir / "runs" / config.name),
            "export": config.export.model_copy(update={"model_root": str(workdir / "models")}),
        }
    )


def make_task(workdir: Path) -> Any:
    from research.experiments.task import ExperimentTask

    return ExperimentTask(load_config(workdir), model_fn=build_classifier)


# ## 6. Training, a crash, and the resume
#
# A second copy of this script trains (`--train-only`) while this one waits for the
# run's first committed checkpoint, then kills it with SIGKILL: no chance to clean up,
# as when a machine dies. Training again with the same Task picks up the latest
# committed checkpoint (weights, optimizer, random state, input position) and ends at
# the step an uninterrupted run would have reached.


def train_until_killed(workdir: Path, checkpoints: Path, timeout: float = 600.0) -> int:
    """Train in a child process, SIGKILL it after its first checkpoint; the step it left."""
    from training.checkpoints import latest_committed_step

    log = workdir / "killed-run.log"
    command = [sys.executable, __file__, "--workdir", str(workdir), "--train-only"]
    with log.open("wb") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        step = None
        while not step:
            if child.poll() is not None:
                raise SystemExit(f"training exited ({child.returncode}) too early; see {log}")
            if time.monotonic() > deadline:
                child.kill()
                raise SystemExit(f"no checkpoint after {timeout:.0f}s; see {log}")
            step = latest_committed_step(checkpoints)
            time.sleep(0.05)  # a file another process writes: nothing to block on but time
        child.send_signal(signal.SIGKILL)
        child.wait()
    if child.returncode != -signal.SIGKILL:
        raise SystemExit(f"training ended ({child.returncode}) before it was killed; see {log}")
    # It may have committed another checkpoint between the look and the kill.
    step = latest_committed_step(checkpoints)
    print(f"killed the training process (SIGKILL); its last committed checkpoint: step {step}")
    return step


# ## 7. Serving
#
# The gateway serves the model repository as TensorFlow Serving would, so any TF
# Serving client works unchanged: here the stock gRPC stub.


def predict_with_grpc(target: str, model: str, feature: str, images: np.ndarray) -> Any:
    """A ``PredictResponse`` from ``PredictionService/Predict`` for a batch of image files."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs[feature].CopyFrom(tf.make_tensor_proto(images))
    with grpc.insecure_channel(target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=30
        )
    return response


def serve_and_call(task: Any, dataset: Path, model_root: Path, workdir: Path) -> None:
    import tensorflow as tf

    from research.data.input_pipeline import make_dataset
    from serving.process import GatewayProcess

    (feature,) = task.inputs
    (head,) = task.heads
    name = task.config.export.model_name or task.config.name
    # PNG files, as a client has them: the served graph decodes them as training did.
    test = make_dataset(dataset, "test", batch_size=8, shuffle=False, raw=True)
    features, labels = next(iter(test))
    images = features[feature].numpy()
    with GatewayProcess(model_root, log_path=workdir / "gateway.log") as gateway:
        response = predict_with_grpc(gateway.grpc_target, name, feature, images)
    probabilities = tf.make_ndarray(response.outputs[head])
    print(
        f"gRPC Predict {name} version {response.model_spec.version.value}: "
        f"predicted {probabilities.argmax(-1).tolist()}, true {labels.numpy().tolist()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument(
        "--train-only", action="store_true", help="only train (the process that is killed)"
    )
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    from training.run import train

    if args.train_only:
        train(make_task(workdir), progress=False)
        return

    dataset = build_digits_dataset(workdir)
    print(f"built the digits dataset: {dataset}")
    task = make_task(workdir)
    config = task.config
    # Start from scratch, so that the run is interrupted and the model is version 1.
    shutil.rmtree(config.run_path, ignore_errors=True)
    model_root = config.resolve(config.export.model_root)
    shutil.rmtree(model_root / (config.export.model_name or config.name), ignore_errors=True)

    model = task.build_model()
    shapes = {name: tuple(t.shape) for name, t in {**model.input, **model.output}.items()}
    print(f"the model as Slipway trains it ({model.name}): inputs and outputs {shapes}")

    step = train_until_killed(workdir, config.checkpoint_path)
    outcome = train(task, progress=False)
    if outcome.exit_code != 0:
        raise SystemExit(f"the resumed run failed with exit code {outcome.exit_code}")
    print(f"resumed from step {step} and finished at step {outcome.step} of {task.total_steps}")
    version, directory = outcome.published
    print(f"the model repository holds version {version} of the model: {directory}")

    serve_and_call(task, dataset, model_root, workdir)


if __name__ == "__main__":
    main()
