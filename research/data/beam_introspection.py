"""Beam's look at a function's parameters, taken once per function instead of once per question.

Beam asks for the parameters of every method of every DoFn (``get_function_args_defaults``,
an ``inspect.signature`` each) whenever it applies a transform, translates the pipeline to
its runner API, checks for state and timers, and again for each bundle it sets up: about
a dozen times per DoFn method and build, a third of a small dataset build's time. A Python
function's parameters do not change once it is defined, so the first answer serves every
later question about the same function (bound methods are asked about through the function
they bind: their parameters are its parameters without the first). Anything else Beam may
be asked about (a callable object, a ``functools.partial``, a builtin) is inspected afresh,
as Beam does.

The cache holds functions weakly: a pipeline's lambdas are freed with the pipeline.
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from apache_beam.transforms import core

ArgsDefaults = tuple[list[str], list[Any]]

_inspect: Callable[[Any], ArgsDefaults] = core.get_function_args_defaults
_functions: weakref.WeakKeyDictionary[Callable[..., Any], ArgsDefaults] = (
    weakref.WeakKeyDictionary()
)
_bound: weakref.WeakKeyDictionary[Callable[..., Any], ArgsDefaults] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _cache_for(function: Any) -> tuple[weakref.WeakKeyDictionary | None, Any]:
    """Which cache answers for ``function``, and under what key (None: not cached)."""
    if type(function) is types.FunctionType:
        return _functions, function
    if type(function) is types.MethodType and type(function.__func__) is types.FunctionType:
        return _bound, function.__func__
    return None, None


def function_args_defaults(function: Any) -> ArgsDefaults:
    """Beam's ``get_function_args_defaults``, remembered per Python function.

    Callers get their own lists, so one that edits its answer cannot change another's.
    """
    cache, key = _cache_for(function)
    if cache is None:
        return _inspect(function)
    with _lock:
        known = cache.get(key)
    if known is None:
        known = _inspect(function)
        with _lock:
            cache[key] = known
    args, defaults = known
    return list(args), list(defaults)


def install() -> None:
    """Make Beam's own lookups go through the cache (idempotent)."""
    core.get_function_args_defaults = function_args_defaults
