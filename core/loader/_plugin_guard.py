"""Each plugin's hook implementations, guarded so that its failures name it.

pluggy runs the hooks (order, ``tryfirst``/``trylast``, ``firstresult``,
``wrapper=True`` and old-style ``hookwrapper=True``), but it does not know that
a ``RuntimeError`` from a plugin is that plugin's bug rather than bad input. So
the host registers, under the plugin's name, a :class:`GuardedPlugin`: a view
holding the plugin's hookimpl functions, each wrapped at registration time. A
wrapped implementation

- turns an exception that is not a :class:`~loader.errors.LoadError` into a
  :class:`~loader.errors.PluginError` naming the plugin and the hook;
- guards an iterator it returns (a weight stream is consumed after the hook
  returned), so errors while iterating name the plugin too;
- says which plugin is running (:func:`calling_plugin`), for callbacks such as
  ``register`` that must know who called them;
- notes its non-``None`` answer, so a ``firstresult`` call can report which
  plugin answered (:func:`recording_answers`).

The view keeps pluggy's own discovery (``parse_hookimpl_opts``), options and
argument names (read through ``__wrapped__``), so a plugin's hooks are called
exactly as pluggy documents; only the errors change.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import pluggy

from .errors import LoadError, PluginError

__all__ = [
    "GuardedPlugin",
    "GuardedStream",
    "calling_plugin",
    "plugin_failed",
    "recording_answers",
]

_running: ContextVar[str | None] = ContextVar("loader_running_plugin", default=None)
_answers: ContextVar[list[tuple[str, object]] | None] = ContextVar("loader_hook_answers", default=None)


def plugin_failed(plugin: str, hook: str, exc: BaseException) -> PluginError:
    """The one message for a plugin's bug: plugin, hook, exception type and text."""
    return PluginError(f"plugin {plugin!r} failed in {hook}: {type(exc).__name__}: {exc}")


def calling_plugin() -> str | None:
    """The plugin whose hook implementation is running now, ``None`` outside any."""
    return _running.get()


@contextmanager
def recording_answers() -> Iterator[list[tuple[str, object]]]:
    """Collect ``(plugin, answer)`` for every non-``None`` answer given while active.

    A hook called from inside an implementation records into its own list, so
    answers never leak between nested calls.
    """
    answers: list[tuple[str, object]] = []
    token = _answers.set(answers)
    try:
        yield answers
    finally:
        _answers.reset(token)


class _Blame:
    """While active, ``plugin`` is running; its non-``LoadError`` exceptions become its :class:`PluginError`."""

    def __init__(self, plugin: str, hook: str) -> None:
        self.plugin, self.hook = plugin, hook

    def __enter__(self) -> None:
        self._token = _running.set(self.plugin)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _running.reset(self._token)
        if isinstance(exc, Exception) and not isinstance(exc, LoadError):
            raise plugin_failed(self.plugin, self.hook, exc) from exc


class GuardedStream(Iterator[Any]):
    """An iterator a plugin returned, whose errors while iterating name the plugin."""

    def __init__(self, stream: Iterator[Any], plugin: str, hook: str) -> None:
        self.stream, self.plugin, self.hook = stream, plugin, hook

    def __next__(self) -> Any:
        try:
            return next(self.stream)
        except (StopIteration, LoadError):
            raise
        except Exception as exc:
            raise plugin_failed(self.plugin, self.hook, exc) from exc

    def close(self) -> None:
        """Close the plugin's iterator (a generator's ``finally`` releases its files)."""
        close = getattr(self.stream, "close", None)
        if close is not None:
            with _Blame(self.plugin, self.hook):
                close()


def _answered(plugin: str, hook: str, result: Any) -> Any:
    if isinstance(result, Iterator) and not isinstance(result, GuardedStream):
        result = GuardedStream(result, plugin, hook)
    answers = _answers.get()
    if result is not None and answers is not None:
        answers.append((plugin, result))
    return result


def _guard_call(function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with _Blame(plugin, hook):
            result = function(*args, **kwargs)
        return _answered(plugin, hook, result)

    return guarded


def _guard_wrapper(function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
    """A ``wrapper=True`` implementation: pluggy sends the result in, or throws the inner exception.

    An exception thrown in from an inner implementation is already a
    ``LoadError`` (every implementation is guarded), so it passes through;
    anything else leaving the wrapper is the wrapper's own failure.
    """

    def guarded(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
        with _Blame(plugin, hook):
            result = yield from function(*args, **kwargs)
        return _answered(plugin, hook, result)

    return guarded


def _guard_old_style_wrapper(function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
    """A ``hookwrapper=True`` implementation: one ``yield`` receives pluggy's ``Result``.

    Driven by hand rather than with ``yield from`` so the result the wrapper
    leaves (``force_result``) can be noted as its answer when it replaced the
    inner one.
    """

    def guarded(*args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        with _Blame(plugin, hook):
            teardown = function(*args, **kwargs)
            if next(teardown, _DID_NOT_YIELD) is _DID_NOT_YIELD:
                raise RuntimeError("the hookwrapper did not yield")
        outcome: pluggy.Result[Any] = yield
        with _Blame(plugin, hook):
            try:
                teardown.send(outcome)
            except StopIteration:
                pass
            else:
                teardown.close()
                raise RuntimeError("the hookwrapper yielded a second time")
        if outcome.exception is None:
            result = outcome.get_result()
            guarded = _answered(plugin, hook, result)
            if guarded is not result:
                outcome.force_result(guarded)

    return guarded


_DID_NOT_YIELD = object()


class GuardedPlugin:
    """What the host registers with pluggy in place of ``plugin``: its hook implementations, each guarded.

    Discovery is pluggy's own (``pm.parse_hookimpl_opts``), and each guarded
    function carries the implementation's options and, through
    ``__wrapped__``, its signature, so pluggy validates, orders and calls it
    as it would the original.
    """

    def __init__(self, plugin: object, name: str, pm: pluggy.PluginManager) -> None:
        self.plugin = plugin
        self._name = name
        marker = f"{pm.project_name}_impl"
        for attr in dir(plugin):
            opts = pm.parse_hookimpl_opts(plugin, attr)
            if opts is None:
                continue
            hook = opts.get("specname") or attr
            function = getattr(plugin, attr)
            # A wrapper that is not a generator function gets the plain guard, so pluggy refuses it as
            # it would the original ("Declared as wrapper=True ... but function is not a generator").
            generator = inspect.isgeneratorfunction(function)
            if opts.get("wrapper") and generator:
                guarded = _guard_wrapper(function, name, hook)
            elif opts.get("hookwrapper") and generator:
                guarded = _guard_old_style_wrapper(function, name, hook)
            else:
                guarded = _guard_call(function, name, hook)
            functools.update_wrapper(guarded, function)
            setattr(guarded, marker, opts)
            setattr(self, attr, guarded)

    def __repr__(self) -> str:
        return f"<GuardedPlugin {self._name!r} of {self.plugin!r}>"
