"""The boolean switches of ``load_model`` (expert parallelism, remote code): typed, carried to the session."""

from __future__ import annotations

import pytest

from loader._cli.parser import build_parser
from loader._pipeline.load import build_options
from loader.errors import UnsupportedError


@pytest.mark.parametrize("name", ["enable_expert_parallel", "trust_remote_code"])
def test_a_switch_that_is_not_a_bool_is_refused_by_name(name: str) -> None:
    with pytest.raises(UnsupportedError, match=rf"^{name} must be True or False, found 'yes'$"):
        build_options(**{name: "yes"})


def test_switches_default_off_and_are_carried_into_the_options() -> None:
    assert not build_options().enable_expert_parallel
    assert not build_options().trust_remote_code
    options = build_options(enable_expert_parallel=True, trust_remote_code=True)
    assert options.enable_expert_parallel and options.trust_remote_code


@pytest.mark.parametrize("command", ["load", "generate"])
def test_cli_flags_have_vllm_names(command: str) -> None:
    extra = ["--prompt", "hi"] if command == "generate" else []
    args = build_parser("SOURCE").parse_args(
        [command, "some/model", "--enable-expert-parallel", "--trust-remote-code", *extra])
    assert args.enable_expert_parallel and args.trust_remote_code
    args = build_parser("SOURCE").parse_args([command, "some/model", *extra])
    assert not args.enable_expert_parallel and not args.trust_remote_code
