"""``model: {type: python, build: ..., args: ...}``: researchers' own model functions."""

from __future__ import annotations

import runpy
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tf_keras as keras

from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model
from research.models import HeadSpec, InputSpec, ModelConfig, PythonModelConfig
from research.models.registry import build_model
from research.models.specs import ModelInterfaceError
from tests.support.keras_checks import predict

INPUTS = {"measurements": InputSpec(shape=(4,))}
HEADS = {"species": HeadSpec(kind="classification", num_classes=3)}

MODEL_CODE = """
import tf_keras as keras


def build(inputs, heads, width=8):
    (name,) = inputs
    x = keras.Input(inputs[name].shape, name=name)
    hidden = keras.layers.Dense(width, activation="relu", name="hidden")(x)
    (head,) = heads
    output = keras.layers.Dense(heads[head].num_classes, activation="softmax")(hidden)
    return keras.Model(x, output, name="arch")


def broken(inputs, heads):
    raise ValueError("widths must be even")


def not_a_model(inputs, heads):
    return "a string"


NOT_CALLABLE = 3
"""


class Experiment(StrictModel):
    model: ModelConfig


@pytest.fixture
def experiment_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory to write an experiment's model code into; sys.path and the modules
    imported from it are restored afterwards, so tests cannot see each other's code."""
    path_before, modules_before = list(sys.path), set(sys.modules)
    yield tmp_path
    sys.path[:] = path_before
    for name in set(sys.modules) - modules_before:
        del sys.modules[name]


def _unique(prefix: str) -> str:
    """A module name no other test (or installed package) uses."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _build(build: str, base_dir: Path, **args: object) -> keras.Model:
    config = {"type": "python", "build": build, "args": args}
    return build_model(config, INPUTS, HEADS, base_dir=base_dir, source="exp.yaml")


def _error(build: str, base_dir: Path, **args: object) -> str:
    with pytest.raises((ConfigError, ModelInterfaceError)) as caught:
        _build(build, base_dir, **args)
    return str(caught.value)


def test_experiment_file_names_a_python_model(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("model:\n  type: python\n  build: my_pkg.models:build\n  args: {width: 64}\n")
    model = load_yaml_model(path, Experiment).model.root
    assert model == PythonModelConfig(build="my_pkg.models:build", args={"width": 64})
    assert (model.target, model.function) == ("my_pkg.models", "build")


@pytest.mark.parametrize("build", ["my_pkg.models", "my_pkg.models:", ":build", "a-b:build"])
def test_malformed_build_reference_names_the_key(tmp_path: Path, build: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(f"model:\n  type: python\n  build: '{build}'\n")
    with pytest.raises(ConfigError) as caught:
        load_yaml_model(path, Experiment)
    assert str(caught.value) == (
        f"{path}:3: model.build: expected 'package.module:function' or "
        f"'path/to/file.py:function'. Received: build={build!r}"
    )


def test_module_in_the_experiment_directory(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    model = _build(f"{name}:build", experiment_dir, width=5)
    assert model.get_layer("arch").get_layer("hidden").units == 5
    assert list(model.output) == ["species"]
    outputs = predict(model, {"measurements": np.zeros((2, 4), np.float32)})
    assert outputs["species"].shape == (2, 3)


def test_module_in_a_package_of_the_experiment_directory(experiment_dir: Path) -> None:
    package = experiment_dir / _unique("pkg")
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODEL_CODE)
    model = _build(f"{package.name}.models:build", experiment_dir)
    assert list(model.output) == ["species"]


def test_file_path_relative_to_the_experiment(experiment_dir: Path) -> None:
    folder = experiment_dir / "models"
    folder.mkdir()
    name = _unique("arch")
    (folder / f"{name}.py").write_text(f"from {name}_widths import WIDTH\n" + MODEL_CODE)
    (folder / f"{name}_widths.py").write_text("WIDTH = 4\n")
    model = _build(f"models/{name}.py:build", experiment_dir)
    assert list(model.output) == ["species"]
    assert sys.modules[name].WIDTH == 4  # the file's neighbours are importable


def test_module_not_found_says_where_it_looked(experiment_dir: Path) -> None:
    name = _unique("missing")
    assert _error(f"{name}.models:build", experiment_dir) == (
        f"exp.yaml: model.build: no module named {name!r} (looked in sys.path and in the "
        f"experiment's directory {experiment_dir.resolve()}). "
        f"Received: build='{name}.models:build'"
    )


def test_file_not_found(experiment_dir: Path) -> None:
    assert _error("models/arch.py:build", experiment_dir) == (
        f"exp.yaml: model.build: file {experiment_dir.resolve() / 'models/arch.py'} not found "
        f"(a relative path is relative to the experiment's directory "
        f"{experiment_dir.resolve()}). Received: build='models/arch.py:build'"
    )


def test_missing_dependency_of_the_module_is_not_a_missing_module(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text("import not_installed_anywhere\n")
    assert _error(f"{name}:build", experiment_dir) == (
        f"exp.yaml: model.build: importing {name} raised ModuleNotFoundError at {name}.py:1: "
        "No module named 'not_installed_anywhere'"
    )


def test_syntax_error_names_the_line(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text("x = 1\ndef build(:\n")
    message = _error(f"{name}.py:build", experiment_dir)
    assert message.startswith(
        f"exp.yaml: model.build: importing {experiment_dir.resolve() / name}.py raised "
        f"SyntaxError at {name}.py:2: "
    )


def test_no_such_function_lists_what_the_module_has(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    assert _error(f"{name}:biuld", experiment_dir) == (
        f"exp.yaml: model.build: module {name!r} ({experiment_dir.resolve() / name}.py) has no "
        "attribute 'biuld' (its public callables: broken, build, not_a_model). "
        f"Received: build='{name}:biuld'"
    )


def test_attribute_that_is_not_a_function(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    assert "'NOT_CALLABLE' in module" in _error(f"{name}:NOT_CALLABLE", experiment_dir)
    assert _error(f"{name}:NOT_CALLABLE", experiment_dir).endswith(
        f"is a int, not a function. Received: build='{name}:NOT_CALLABLE'"
    )


def test_arguments_the_function_does_not_take_name_model_args(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    assert _error(f"{name}:build", experiment_dir, widht=3) == (
        "exp.yaml: model.args: build(inputs, heads, width=8) cannot take them: got an "
        "unexpected keyword argument 'widht'. Received: args={'widht': 3}"
    )


def test_function_that_raises_names_its_line_and_message(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    line = MODEL_CODE.splitlines().index('    raise ValueError("widths must be even")') + 1
    assert _error(f"{name}:broken", experiment_dir) == (
        f"exp.yaml: model.build: {name}:broken raised ValueError at {name}.py:{line}: "
        "widths must be even"
    )


def test_function_that_returns_no_model(experiment_dir: Path) -> None:
    name = _unique("arch")
    (experiment_dir / f"{name}.py").write_text(MODEL_CODE)
    assert _error(f"{name}:not_a_model", experiment_dir) == (
        f"exp.yaml: {name}:not_a_model: expected a tf_keras Model. Received: builtins.str"
    )


def test_file_named_like_an_imported_module_must_be_renamed(experiment_dir: Path) -> None:
    (experiment_dir / "json.py").write_text(MODEL_CODE)
    message = _error("json.py:build", experiment_dir)
    assert message.startswith(
        f"exp.yaml: model.build: {experiment_dir.resolve() / 'json.py'} would be imported as "
        "'json', but module 'json' ("
    )
    assert message.endswith("already has that name: rename the file")


def test_script_naming_itself_builds_with_its_own_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script run as ``__main__`` whose experiment points at the script file gets the
    classes it defined, not a second copy of the file imported under another name."""
    script = tmp_path / "train_mine.py"
    script.write_text(
        textwrap.dedent(
            """
            import tf_keras as keras
            from research.models.registry import build_model

            class Doubler(keras.layers.Layer):
                def call(self, x):
                    return 2.0 * x

            def build(inputs, heads):
                x = keras.Input((4,), name="measurements")
                y = keras.layers.Dense(3, activation="softmax")(Doubler()(x))
                return keras.Model(x, y)

            if __name__ == "__main__":
                model = build_model(
                    {"type": "python", "build": "train_mine.py:build"},
                    {"measurements": {"shape": [4]}},
                    {"species": {"kind": "classification", "num_classes": 3}},
                    base_dir=__file__.rpartition("/")[0],
                )
                layers = [layer for layer in model.submodules if isinstance(layer, Doubler)]
                assert len(layers) == 1, layers
                assert "train_mine" not in __import__("sys").modules
                print("same classes")
            """
        )
    )
    runpy.run_path(str(script), run_name="__main__")  # as ``python train_mine.py`` runs it
    assert capsys.readouterr().out.strip() == "same classes"
