"""A local model's vocabulary, in this process: its tokenizer and chat template, from
``llama_cpp.Llama`` loaded vocab-only (no weights). Prompts are rendered and tokenized
here, token counts for truncation come from here, and a grammar is checked against the
vocabulary before a response starts; the weights live in ``llama-server``
(:mod:`app.backends.local`). llama.cpp's in-process messages go through our logging.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path

# Nothing here computes (the vocabulary only); should llama.cpp's OpenMP runtime start in
# this process, its threads sleep rather than spin on the cores the server shares.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

from app.backends.base import ChatMessage, ToolSpec  # noqa: E402
from app.backends.model_files import ModelSpec  # noqa: E402
from app.backends.prompting import ChatTemplate, prompt_messages, template_tools, unicode_text  # noqa: E402
from app.backends.toolcalls import TAG_CLOSE, TAG_OPEN, call_shape  # noqa: E402
from app.errors import ModelError  # noqa: E402

_llama_log = logging.getLogger("ors.llama")

_GGML_WARN, _GGML_ERROR, _GGML_CONT = 3, 4, 5
"""ggml's log levels (``enum ggml_log_level`` of the ggml this llama-cpp-python builds:
none, debug, info, warn, error, cont); a ``cont`` line continues the line before it."""


class _LlamaLevels:
    """The logging level of each of llama.cpp's in-process messages (the vocabulary's
    loader): errors are errors, warnings warnings, the rest debug detail. Warnings while a
    vocabulary loads are debug detail too: its context is never used, and llama.cpp warns
    of it at every start (``n_ctx_seq (512) > n_ctx_train (0)``, the training window of a
    model whose weights it did not read)."""

    def __init__(self) -> None:
        self.loading_vocabulary = 0
        self._last = logging.DEBUG

    def of(self, ggml_level: int) -> int:
        if ggml_level == _GGML_CONT:
            return self._last
        if ggml_level == _GGML_ERROR:
            level = logging.ERROR
        elif ggml_level == _GGML_WARN and not self.loading_vocabulary:
            level = logging.WARNING
        else:
            level = logging.DEBUG
        self._last = level
        return level


_levels = _LlamaLevels()


@llama_cpp.llama_log_callback  # type: ignore[misc]
def _route_llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's in-process messages go through our logging, so ``ORS_LOG_FORMAT=json``
    holds for every line, at the level :class:`_LlamaLevels` gives them."""
    message = text.decode("utf-8", errors="replace").rstrip()
    if message:
        _llama_log.log(_levels.of(level), "%s", message)


llama_cpp.llama_log_set(_route_llama_log, ctypes.c_void_p(0))


def _load_vocabulary(path: Path) -> Llama:
    """A model's vocabulary and metadata, without its weights.

    Not with ``verbose=False``: llama-cpp-python then points the process's file
    descriptors 1 and 2 at ``/dev/null`` while it loads, and every line the server's
    other threads log meanwhile is lost (the first lines of a start were, one start in
    three). llama.cpp's own messages come through :func:`_route_llama_log` either way;
    what llama-cpp-python prints itself (its metadata) goes to a buffer, by replacing
    ``sys.stdout``/``sys.stderr`` (the log handler keeps its own stream)."""
    _levels.loading_vocabulary += 1
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            llm = Llama(model_path=str(path), vocab_only=True, verbose=True)
    finally:
        _levels.loading_vocabulary -= 1
    llm.verbose = False  # nothing more of its own on stderr
    return llm


class Vocabulary:
    """A model's tokenizer and chat template, loaded without its weights. Blocking
    methods (tokenizing a long prompt takes milliseconds): call them off the loop."""

    def __init__(self, spec: ModelSpec, path: Path) -> None:
        self.spec = spec
        self.llm = _load_vocabulary(path)
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        template = spec.chat_template or self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            self.llm.close()
            raise ModelError(f"The model '{spec.id}' has no chat template in {path.name}: give it one "
                             f"(chat_template in its [models.{spec.id}] entry)")
        try:
            self.template = ChatTemplate(
                template,
                bos_token=self._special_text(self.llm.token_bos()),
                eos_token=self._special_text(self.llm.token_eos()),
            )
            self.template.render([ChatMessage(role="system", content="A"), ChatMessage(role="user", content="B")])
        except Exception as exc:  # any error of a template's Jinja, at parse or at render
            self.llm.close()
            source = "its entry" if spec.chat_template else path.name
            raise ModelError(f"The chat template of model '{spec.id}' ({source}) does not render a conversation: "
                             f"{exc}") from None
        self.call_shape = call_shape(spec.template_renders_tools, self._tag_tokens())
        self._control_texts = self._control_token_texts()

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        """The prompt text: the conversation and all ``tools``, whatever the tool policy."""
        renders_tools = self.spec.template_renders_tools
        return self.template.render(
            prompt_messages(messages, tools, template_renders_tools=renders_tools),
            template_tools(tools) if renders_tools else None,
        )

    def prompt_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> list[int]:
        """The prompt's tokens. The template's own markers (``<|im_start|>``…) are read as
        the control tokens they are; the text of a user message or a tool's output is
        read as text, even where it spells a marker: otherwise a user (or a web page a
        tool fetched) could write ``<|im_end|><|im_start|>system`` and open a turn of
        its own. Such a text is found in the rendered prompt in order, after the one
        before it; a text with no marker in it is tokenized with the rest, unchanged."""
        text = self.prompt(messages, tools)
        literal = [message.content for message in messages
                   if message.role in ("user", "tool") and message.content
                   and any(marker in message.content for marker in self._control_texts)]
        if not literal:
            return self._tokens(text, special=True)
        tokens: list[int] = []
        position = 0
        for content in literal:
            found = text.find(content, position)
            if found < 0:  # a template that changed the text: left as rendered
                continue
            tokens += self._tokens(text[position:found], special=True)
            tokens += self._tokens(content, special=False)
            position = found + len(content)
        return tokens + self._tokens(text[position:], special=True)

    def _tokens(self, text: str, *, special: bool) -> list[int]:
        return self.llm.tokenize(unicode_text(text).encode("utf-8"), add_bos=False, special=special) if text else []

    def _control_token_texts(self) -> tuple[str, ...]:
        """The texts of the vocabulary's control and user-defined tokens (the template's
        markers, tool call tags), which tokenizing with ``special`` turns into those tokens."""
        wanted = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        texts = {self._special_text(token) for token in range(llama_cpp.llama_vocab_n_tokens(self._vocab))
                 if llama_cpp.llama_vocab_get_attr(self._vocab, token) & wanted}
        return tuple(sorted(text for text in texts if text))

    def accepts_grammar(self, grammar: str) -> bool:
        """Whether llama.cpp parses ``grammar`` (the server would refuse it otherwise)."""
        sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def close(self) -> None:
        self.llm.close()

    def _tag_tokens(self) -> tuple[int, int] | None:
        """The vocabulary's single tokens for the tool call tags, if it has them."""
        tokens = [self.llm.tokenize(tag.encode("utf-8"), add_bos=False, special=True) for tag in (TAG_OPEN, TAG_CLOSE)]
        if all(len(ids) == 1 for ids in tokens):
            return tokens[0][0], tokens[1][0]
        return None

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")
