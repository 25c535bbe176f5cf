"""Call the function a ``model: {type: python, build: ...}`` section names.

Researchers train their own architectures by pointing an experiment at a function;
everything that can go wrong before that function returns a model (a module that is not
found, a function that is not there, ``args`` it does not take, an exception inside it)
is a ConfigError naming ``model.build`` or ``model.args``, with the value received,
because the person reading it is editing the experiment, not this package.

Two directories are added to ``sys.path`` for good (never ahead of what is there): the
experiment's directory when a module is found only there, and a file's own directory,
so the user's code can import its neighbours now and whenever Keras later loads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from contracts.yaml_config import ConfigError
from research.models.configs import PythonModelConfig
from research.models.specs import HeadSpec, InputSpec


def call_build_function(
    config: PythonModelConfig,
    inputs: Mapping[str, InputSpec],
    heads: Mapping[str, HeadSpec],
    *,
    base_dir: str | Path | None,
    source: str,
) -> Any:
    """What ``build(inputs, heads, **args)`` returns, unchecked (``conform_model`` checks).

    ``base_dir`` is the experiment file's directory: file paths are relative to it and
    modules not importable from ``sys.path`` are looked up in it (default: the current
    directory).
    """
    base = Path(base_dir if base_dir is not None else ".").resolve()
    function = load_build_function(config, base, source)
    arguments = (dict(inputs), dict(heads))
    _check_arguments(function, arguments, config, source)
    try:
        return function(*arguments, **config.args)
    except Exception as exc:
        code = getattr(function, "__code__", None)  # None for a partial or a callable class
        where = _raised_at(exc, code.co_filename if code else None)
        raise ConfigError(
            f"{source}: model.build: {config.build} raised {type(exc).__name__}{where}: {exc}"
        ) from exc


def load_build_function(config: PythonModelConfig, base_dir: Path, source: str) -> Callable:
    """The function ``config.build`` names, its module imported (once) as Python would."""
    if config.target.endswith(".py"):
        module = _import_file(config, base_dir, source)
    else:
        module = _import_module(config, base_dir, source)
    found: Any = module
    for part in config.function.split("."):
        if not hasattr(found, part):
            defined = sorted(
                name
                for name, value in vars(module).items()
                if callable(value) and not name.startswith("_")
            )
            raise ConfigError(
                f"{source}: model.build: {_describe(module)} has no attribute "
                f"{config.function!r} (its public callables: {', '.join(defined) or 'none'}). "
                f"Received: build={config.build!r}"
            )
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError(
            f"{source}: model.build: {config.function!r} in {_describe(module)} is a "
            f"{type(found).__name__}, not a function. Received: build={config.build!r}"
        )
    return found


def _check_arguments(
    function: Callable, arguments: tuple[Any, ...], config: PythonModelConfig, source: str
) -> None:
    """Refuse ``args`` the function cannot take before calling it, naming ``model.args``."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: the call itself will tell
    try:
        signature.bind(*arguments, **config.args)
    except TypeError as exc:
        raise ConfigError(
            f"{source}: model.args: {config.function}{signature} cannot take them: {exc}. "
            f"Received: args={config.args!r}"
        ) from None


def _import_module(config: PythonModelConfig, base_dir: Path, source: str) -> ModuleType:
    """``import package.module``; when it is nowhere on ``sys.path``, from ``base_dir`` too."""
    name = config.target
    try:
        return _import(name, source)
    except ModuleNotFoundError as exc:
        if not _is_part_of(exc.name, name):
            raise _import_failed(name, exc, source) from exc
    if str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
        importlib.invalidate_caches()
    try:
        return _import(name, source)
    except ModuleNotFoundError as exc:
        if _is_part_of(exc.name, name):
            raise ConfigError(
                f"{source}: model.build: no module named {exc.name!r} (looked in sys.path "
                f"and in the experiment's directory {base_dir}). Received: build={config.build!r}"
            ) from None
        raise _import_failed(name, exc, source) from exc


def _import(name: str, source: str) -> ModuleType:
    """``importlib.import_module`` with every failure but a missing module a ConfigError."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise
    except Exception as exc:
        raise _import_failed(name, exc, source) from exc


def _import_file(config: PythonModelConfig, base_dir: Path, source: str) -> ModuleType:
    """The module in the file ``build`` names, registered under the file's name as a script is.

    A file already running as ``__main__`` (an example script whose experiment points
    back at it) is that module: importing it a second time would make a second copy of
    every class in it, and Keras would then meet two different classes of one name.
    """
    path = (base_dir / Path(config.target).expanduser()).resolve()
    if not path.is_file():
        raise ConfigError(
            f"{source}: model.build: file {path} not found (a relative path is relative "
            f"to the experiment's directory {base_dir}). Received: build={config.build!r}"
        )
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(
            f"{source}: model.build: {path.name} cannot be imported: a module file name "
            f"must be a Python identifier. Received: build={config.build!r}"
        )
    for module in (sys.modules.get("__main__"), sys.modules.get(name)):
        if _file_of(module) == path:
            return module
    if name in sys.modules:
        raise ConfigError(
            f"{source}: model.build: {path} would be imported as {name!r}, but "
            f"{_describe(sys.modules[name])} already has that name: rename the file"
        )
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_failed(str(path), exc, source) from exc
    return module


def _import_failed(name: str, exc: BaseException, source: str) -> ConfigError:
    where = _raised_at(exc, None)
    return ConfigError(
        f"{source}: model.build: importing {name} raised {type(exc).__name__}{where}: {exc}"
    )


def _is_part_of(missing: str | None, module: str) -> bool:
    """Whether the missing module is ``module`` or a package on its path (not a dependency)."""
    return missing is not None and (module == missing or module.startswith(missing + "."))


def _file_of(module: ModuleType | None) -> Path | None:
    location = getattr(module, "__file__", None)
    return Path(location).resolve() if location else None


def _describe(module: ModuleType) -> str:
    location = getattr(module, "__file__", None)
    return f"module {module.__name__!r} ({location})" if location else repr(module)


def _raised_at(exc: BaseException, filename: str | None) -> str:
    """`` at file.py:12``: the deepest line in ``filename``, else the deepest line at all."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {Path(exc.filename).name}:{exc.lineno}"
    if filename is not None:
        frames = [frame for frame in frames if frame.filename == filename] or frames
    if not frames:
        return ""
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}"
