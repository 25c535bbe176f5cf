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

Beam also looks for state and timer parameters in every method of a DoFn
(``userstate.get_dofn_specs``: a ``dir()`` of the DoFn and a wrapper per method) whenever it
builds, translates or runs a ParDo; the answer depends only on the DoFn's class and on which
names its instance shadows, so it is remembered per class and shadowed names. A DoFn that
holds a bound method of its own (``beam.Map(obj.method)``) is asked about afresh, since that
method's parameters are part of the answer.

The caches hold functions and classes weakly: a pipeline's lambdas are freed with the pipeline.
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from apache_beam.transforms import core, userstate

ArgsDefaults = tuple[list[str], list[Any]]

_inspect: Callable[[Any], ArgsDefaults] = core.get_function_args_defaults
_functions: weakref.WeakKeyDictionary[Callable[..., Any], ArgsDefaults] = (
    weakref.WeakKeyDictionary()
)
_bound: weakref.WeakKeyDictionary[Callable[..., Any], ArgsDefaults] = weakref.WeakKeyDictionary()
_lock = threading.Lock()

Specs = tuple[set[Any], set[Any]]
_dofn_specs: Callable[[Any], Specs] = userstate.get_dofn_specs
# DoFn class -> {names the instance shadows: (state specs, timer specs)}
_specs: weakref.WeakKeyDictionary[type, dict[frozenset[str], tuple[frozenset, frozenset]]] = (
    weakref.WeakKeyDictionary()
)


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


def _shadowed_names(dofn: Any) -> frozenset[str] | None:
    """The instance attributes of ``dofn``, which with its class decide its specs; None when
    one is a bound method (its parameters count) or the instance has no ``__dict__``."""
    try:
        attributes = vars(dofn)
    except TypeError:
        return None
    if any(isinstance(value, types.MethodType) for value in attributes.values()):
        return None
    return frozenset(attributes)


def dofn_specs(dofn: Any) -> Specs:
    """Beam's ``get_dofn_specs``, remembered per DoFn class and shadowed names.

    Callers get their own sets, as from Beam.
    """
    names = _shadowed_names(dofn)
    if names is None:
        return _dofn_specs(dofn)
    with _lock:
        known = _specs.get(type(dofn), {}).get(names)
    if known is None:
        states, timers = _dofn_specs(dofn)
        known = frozenset(states), frozenset(timers)
        with _lock:
            _specs.setdefault(type(dofn), {})[names] = known
    return set(known[0]), set(known[1])


def install() -> None:
    """Make Beam's own lookups go through the caches (idempotent)."""
    core.get_function_args_defaults = function_args_defaults
    userstate.get_dofn_specs = dofn_specs
