"""Chat templates rendered like Hugging Face does, in Jinja2's sandbox."""

from __future__ import annotations

import pytest

from loader._chat_template import render_chat
from loader.errors import LoadError

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_chatml_renders_with_generation_prompt() -> None:
    text = render_chat(CHATML, [{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_bos_token_and_tojson_are_available() -> None:
    template = "{{ bos_token }}{{ messages[0] | tojson }}"
    assert render_chat(template, [{"role": "user", "content": "é"}], bos_token="<s>") == (
        '<s>{"role": "user", "content": "é"}'
    )


def test_raise_exception_becomes_a_load_error() -> None:
    template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(LoadError, match="Conversation roles must alternate"):
        render_chat(template, [{"role": "user", "content": "x"}])


def test_sandbox_refuses_python_internals() -> None:
    template = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(LoadError, match="chat template cannot be rendered"):
        render_chat(template, [])


def test_syntax_error_is_a_load_error() -> None:
    with pytest.raises(LoadError, match="chat template cannot be rendered"):
        render_chat("{% for %}", [])
