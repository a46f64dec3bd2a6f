"""The typed hook wrappers: call order, argument subsets, plugin errors named."""

from __future__ import annotations

from pathlib import Path

import pluggy
import pytest
import torch

import loader
from loader import _hooks as hooks
from loader._options import LoadOptions
from loader._plugins import create_plugin_host
from loader.checkpoint import Source, WeightFormat
from loader.errors import LoadError, PluginError, SourceNotFoundError, UnsupportedError
from loader.weights import EagerTensor, ReadStats

OPTIONS = LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


def _host():  # type: ignore[no-untyped-def]
    return create_plugin_host(load_entry_points=False)


def test_firstresult_takes_the_first_answer_and_fewer_arguments(tmp_path: Path) -> None:
    class Declines:
        @loader.hookimpl
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return None

    class Answers:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            return WeightFormat(name="fake", files=(str(source.path),))

    host = _host()
    host.register(Answers(), "answers")
    host.register(Declines(), "declines")
    fmt = hooks.detect_format(Source("x", tmp_path), "auto", host)
    assert fmt.name == "fake"


def test_no_format_plugin_says_so(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="no weight files any installed format plugin recognises"):
        hooks.detect_format(Source("x", tmp_path), "auto", _host())
    with pytest.raises(UnsupportedError, match="load_format 'nope' is not provided by any installed plugin"):
        hooks.detect_format(Source("x", tmp_path), "nope", _host())


def test_plugin_exception_names_plugin_and_hook(tmp_path: Path) -> None:
    class Boom:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            raise RuntimeError("kaput")

    host = _host()
    host.register(Boom(), "boom")
    with pytest.raises(PluginError, match=r"plugin 'boom' failed in loader_detect_format: RuntimeError: kaput"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_load_error_from_a_plugin_passes_through(tmp_path: Path) -> None:
    class Strict:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            raise LoadError("bad header in x.bin")

    host = _host()
    host.register(Strict(), "strict")
    with pytest.raises(LoadError, match="^bad header in x.bin$"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_error_while_iterating_names_the_plugin(tmp_path: Path) -> None:
    class Stream:
        @loader.hookimpl
        def loader_iter_weights(self, weight_format):  # type: ignore[no-untyped-def]
            def gen():  # type: ignore[no-untyped-def]
                yield "a", EagerTensor(torch.zeros(1))
                raise ValueError("corrupt block")

            return gen()

    host = _host()
    host.register(Stream(), "stream")
    stream = hooks.iter_weights(Source("x", tmp_path), WeightFormat("fake", ()), OPTIONS, ReadStats(), host)
    assert next(stream)[0] == "a"
    with pytest.raises(PluginError, match="plugin 'stream' failed in loader_iter_weights: ValueError: corrupt block"):
        next(stream)


def test_register_architectures_tells_who_registered() -> None:
    class Models:
        @loader.hookimpl
        def loader_register_architectures(self, register):  # type: ignore[no-untyped-def]
            register("A", "pkg.mod:A")

    host = _host()
    host.register(Models(), "models")
    seen = []
    hooks.register_architectures(lambda plugin: (lambda arch, path: seen.append((plugin, arch, path))), host)
    assert seen == [("models", "A", "pkg.mod:A")]


def test_quantization_requested_without_plugin_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="quantization 'bitsandbytes' is not provided by any installed plugin"):
        hooks.detect_quantization({}, "bitsandbytes", OPTIONS, _host())
    with pytest.raises(UnsupportedError, match="quant_method='gptq'"):
        hooks.detect_quantization({"quantization_config": {"quant_method": "gptq"}}, None, OPTIONS, _host())
    assert hooks.detect_quantization({}, None, OPTIONS, _host()) is None


def test_read_config_from_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["X"]}')
    cfg = hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())
    assert cfg["architectures"] == ["X"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "config.json is not valid JSON"),
        (b"\xff\xfe", "config.json is not UTF-8"),
        (b"[1, 2]", "config.json must be a JSON object, found list"),
    ],
)
def test_bad_config_json_names_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(loader.ConfigError, match=message) as info:
        hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())
    assert str(tmp_path / "config.json") in str(info.value)


def test_missing_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(loader.ConfigError, match="no config.json"):
        hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())


# --- pluggy calls the hooks: order and wrappers as pluggy documents them ------------------------


def _formats(*names: str) -> list[object]:
    """One plugin per name whose ``loader_detect_format`` answers ``WeightFormat(name)``."""

    class Answers:
        def __init__(self, name: str) -> None:
            self.name = name

        @loader.hookimpl
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return WeightFormat(name=self.name, files=(str(source.path),))

    return [Answers(name) for name in names]


def test_a_wrapper_around_detect_format_sees_and_can_change_the_result(tmp_path: Path) -> None:
    seen = []

    class Renames:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            found = yield
            seen.append((requested, found.name))
            return WeightFormat(name=f"wrapped-{found.name}", files=found.files, index=found.index)

    host = _host()
    host.register(Renames(), "renames")  # registered first: a wrapper wraps whatever comes later too
    host.register(_formats("fake")[0], "fake")
    fmt = hooks.detect_format(Source("x", tmp_path), "auto", host)
    assert seen == [("auto", "fake")]
    assert fmt == WeightFormat(name="wrapped-fake", files=(str(tmp_path),))


def test_a_wrapper_that_returns_none_makes_the_format_unrecognised(tmp_path: Path) -> None:
    class Vetoes:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            yield
            return None

    host = _host()
    host.register(_formats("fake")[0], "fake")
    host.register(Vetoes(), "vetoes")
    with pytest.raises(SourceNotFoundError, match="no weight files any installed format plugin recognises"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_an_old_style_hookwrapper_sees_the_outcome_and_can_force_another(tmp_path: Path) -> None:
    class Forces:
        @loader.hookimpl(hookwrapper=True)
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            outcome = yield
            outcome.force_result(WeightFormat(name=f"forced-{outcome.get_result().name}", files=()))

    host = _host()
    host.register(_formats("fake")[0], "fake")
    host.register(Forces(), "forces")
    assert hooks.detect_format(Source("x", tmp_path), "auto", host).name == "forced-fake"


def test_tryfirst_and_trylast_order_the_answers(tmp_path: Path) -> None:
    class First:
        @loader.hookimpl(tryfirst=True)
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return WeightFormat(name="first", files=())

    class Last:
        @loader.hookimpl(trylast=True)
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return WeightFormat(name="last", files=())

    source = Source("x", tmp_path)
    host = _host()
    host.register(Last(), "last")
    older, newer = _formats("older", "newer")
    host.register(older, "older")
    assert hooks.detect_format(source, "auto", host).name == "older"
    host.register(newer, "newer")
    assert hooks.detect_format(source, "auto", host).name == "newer", "plain implementations run newest first"
    host.register(First(), "first")
    assert hooks.detect_format(source, "auto", host).name == "first"
    for name in ("first", "newer", "older"):
        host.unregister(name)
    assert hooks.detect_format(source, "auto", host).name == "last"


def test_first_result_reports_which_plugin_answered(tmp_path: Path) -> None:
    class PassesThrough:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            return (yield)

    class Replaces:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            found = yield
            return WeightFormat(name="replaced", files=found.files)

    source = Source("x", tmp_path)
    host = _host()
    host.register(_formats("fake")[0], "fake")
    host.register(PassesThrough(), "passes")
    answer = hooks._first(host.pm.hook.loader_detect_format, source=source, requested="auto")
    assert answer is not None and (answer.plugin, answer.value.name) == ("fake", "fake")
    host.register(Replaces(), "replaces")
    answer = hooks._first(host.pm.hook.loader_detect_format, source=source, requested="auto")
    assert answer is not None and (answer.plugin, answer.value.name) == ("replaces", "replaced")
    assert hooks._first(host.pm.hook.loader_read_config, source=source, weight_format=answer.value) is None


def test_a_failing_wrapper_is_named_and_an_inner_failure_keeps_its_name(tmp_path: Path) -> None:
    class Boom:
        @loader.hookimpl
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("kaput")

    class FailsAfter:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            found = yield
            return found.nonexistent

    class FailsBefore:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            raise KeyError("setup")
            yield  # a generator all the same

    class SeesInnerError:
        def __init__(self) -> None:
            self.caught: list[BaseException] = []

        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            try:
                return (yield)
            except PluginError as exc:
                self.caught.append(exc)
                raise

    source = Source("x", tmp_path)
    host = _host()
    host.register(_formats("fake")[0], "fake")
    host.register(FailsAfter(), "fails-after")
    with pytest.raises(PluginError, match=r"^plugin 'fails-after' failed in loader_detect_format: AttributeError: "):
        hooks.detect_format(source, "auto", host)
    host.unregister("fails-after")
    host.register(FailsBefore(), "fails-before")
    with pytest.raises(PluginError, match=r"^plugin 'fails-before' failed in loader_detect_format: KeyError: 'setup'$"):
        hooks.detect_format(source, "auto", host)
    host.unregister("fails-before")
    sees = SeesInnerError()
    host.register(sees, "sees")
    host.register(Boom(), "boom")
    with pytest.raises(PluginError, match=r"^plugin 'boom' failed in loader_detect_format: RuntimeError: kaput$"):
        hooks.detect_format(source, "auto", host)
    assert [str(exc) for exc in sees.caught] == ["plugin 'boom' failed in loader_detect_format: RuntimeError: kaput"]


def test_a_failing_old_style_hookwrapper_is_named(tmp_path: Path) -> None:
    class FailsInSetup:
        @loader.hookimpl(hookwrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            raise ValueError("before yield")
            yield

    class FailsInTeardown:
        @loader.hookimpl(hookwrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            yield
            raise ValueError("after yield")

    source = Source("x", tmp_path)
    host = _host()
    host.register(_formats("fake")[0], "fake")
    host.register(FailsInSetup(), "setup")
    with pytest.raises(PluginError, match=r"^plugin 'setup' failed in loader_detect_format: ValueError: before yield$"):
        hooks.detect_format(source, "auto", host)
    host.unregister("setup")
    host.register(FailsInTeardown(), "teardown")
    # pluggy warns about any old-style teardown that raises, then raises it: here, already named
    with pytest.warns(pluggy.PluggyTeardownRaisedWarning, match="Plugin: teardown"), \
            pytest.raises(PluginError, match=r"^plugin 'teardown' failed in loader_detect_format: ValueError: "
                                             r"after yield$"):
        hooks.detect_format(source, "auto", host)


def test_wrappers_of_the_weight_stream_are_guarded_too(tmp_path: Path) -> None:
    class Stream:
        @loader.hookimpl
        def loader_iter_weights(self):  # type: ignore[no-untyped-def]
            def gen():  # type: ignore[no-untyped-def]
                yield "a", EagerTensor(torch.zeros(1))
                yield "b", EagerTensor(torch.ones(1))
                raise ValueError("corrupt block")

            return gen()

    class Renames:
        def __init__(self, fail_at: str | None) -> None:
            self.fail_at = fail_at

        @loader.hookimpl(wrapper=True)
        def loader_iter_weights(self):  # type: ignore[no-untyped-def]
            inner = yield

            def renamed():  # type: ignore[no-untyped-def]
                for name, tensor in inner:
                    if name == self.fail_at:
                        raise IndexError(name)
                    yield f"model.{name}", tensor

            return renamed()

    def stream(host):  # type: ignore[no-untyped-def]
        return hooks.iter_weights(Source("x", tmp_path), WeightFormat("fake", ()), OPTIONS, ReadStats(), host)

    host = _host()
    host.register(Stream(), "stream")
    host.register(Renames(fail_at="b"), "renames")
    weights = stream(host)
    assert next(weights)[0] == "model.a"
    with pytest.raises(PluginError, match=r"^plugin 'renames' failed in loader_iter_weights: IndexError: b$"):
        next(weights)
    host.unregister("renames")
    host.register(Renames(fail_at=None), "renames")
    weights = stream(host)
    assert [next(weights)[0], next(weights)[0]] == ["model.a", "model.b"]
    with pytest.raises(PluginError, match=r"^plugin 'stream' failed in loader_iter_weights: ValueError: corrupt"):
        next(weights)


def test_register_after_the_hook_returned_is_refused() -> None:
    kept = []

    class KeepsTheCallback:
        @loader.hookimpl
        def loader_register_architectures(self, register):  # type: ignore[no-untyped-def]
            kept.append(register)

    host = _host()
    host.register(KeepsTheCallback(), "keeps")
    hooks.register_architectures(lambda plugin: (lambda arch, path: None), host)
    with pytest.raises(PluginError, match=r"register\('A', 'pkg.mod:A'\) was called after loader_register_arch"):
        kept[0]("A", "pkg.mod:A")
