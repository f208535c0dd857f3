"""A custom tool's Lark grammar as GBNF rules, so that llama.cpp can hold a local model's
call of the tool to it (OpenAI's ``{"type": "grammar", "syntax": "lark"}`` format, as in
Codex's free-form ``apply_patch``).

The grammar is read by ``lark`` itself: it parses the definition, resolves ``%import``
from its own library (``common.LF``...), expands EBNF operators, and gives the compiled
rules (plain alternatives of symbol sequences) and terminals (each one string or one
regular expression). They become GBNF rules over the JSON encoding of the text
(:mod:`app.backends.json_text_gbnf`), since the model writes the input as a JSON string:

* a rule: its alternatives; the left recursion that lark's expansion of ``x+`` and
  ``x*`` makes (``a: b | a c``) is rewritten as repetition (``a ::= b c*``), so rules
  the user wrote left-recursive directly are accepted too; left recursion through other
  rules is refused;
* a terminal: its string (case-insensitive with ``i``) or its regular expression;
* ``%ignore``: the ignored terminals may come between any two symbols of a rule, and
  before and after the whole text.

The rules accept the text that a scannerless reading of the grammar accepts: lark's
lexer (longest match, terminal priorities, the contextual lexer) is not simulated, so
where it would split an input differently the rules can be more permissive than a lark
parser with a lexer; for grammars whose terminals do not compete (Codex's) they agree.
What cannot be held is refused with :class:`UnsupportedGrammar`: a definition that is not
valid Lark, one without a ``start`` rule, a ``%import`` relative to a file, a template
definition (lark would expand a self-instantiating one forever), a terminal only
``%declare``\\ d, indirect left recursion, and the regular-expression constructs
:mod:`app.backends.json_text_gbnf` refuses.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lark import Lark
from lark.exceptions import LarkError
from lark.lexer import Lexer, PatternStr

from app.backends.json_text_gbnf import Repeats, Unsupported, literal, regex

START = "start"
"""The rule a grammar's text must match as a whole (lark's default, and OpenAI's)."""

_RELATIVE_IMPORT = re.compile(r"%import\s+\.")
_TEMPLATE = re.compile(r"^[ \t]*(?:%(?:override|extend)[ \t]+)?[?!]?[_a-z][_a-z0-9]*[ \t]*\{", re.MULTILINE)
"""The start of a template's definition (``name{params}: ...``): lark expands a template
that instantiates itself with growing arguments without end, so none is taken."""
_NAME_CHARS = re.compile(r"[^A-Za-z0-9]+")


class UnsupportedGrammar(ValueError):
    """A Lark grammar that cannot become GBNF; the message says why."""


@dataclass(frozen=True, slots=True)
class GbnfRules:
    """A grammar's GBNF: ``root`` names the rule of the whole text; ``rules`` are its
    lines, each ``name ::= ...``, every name starting with the prefix it was made with."""

    root: str
    rules: tuple[str, ...]


class _GrammarOnly(Lexer):
    """lark's extension point for a lexer of one's own, used so that lark builds no
    lexer: only the grammar is wanted here, and lark's lexers refuse terminals that can
    match the empty string (``/(.*)/``), which a grammar for generation may well use."""

    def __init__(self, conf: Any) -> None:
        pass

    def lex(self, lexer_state: Any, parser_state: Any) -> Any:
        raise NotImplementedError("this grammar is not for parsing")


def lark_to_gbnf(definition: str, prefix: str, repeats: Repeats) -> GbnfRules:
    """The GBNF rules of ``definition``, named ``<prefix>-...``; raises
    ``UnsupportedGrammar``."""
    if _RELATIVE_IMPORT.search(definition):
        raise UnsupportedGrammar("a %import relative to a file cannot be resolved; import from lark's library "
                                 "(such as %import common.LF) or define the terminal")
    if _TEMPLATE.search(definition):
        raise UnsupportedGrammar("it defines a template (name{params}); write the rules it stands for instead")
    try:
        grammar = Lark(definition, parser="earley", lexer=_GrammarOnly, start=START, import_paths=[])
    except Exception as error:  # lark raises its own errors, and assorted others for odd input
        reason = _first_line(error) if isinstance(error, LarkError) else f"{type(error).__name__}: {_first_line(error)}"
        raise UnsupportedGrammar(f"it is not a valid Lark grammar: {reason}") from None
    try:
        return _Emitter(prefix, repeats, grammar).emit()
    except Unsupported as error:
        raise UnsupportedGrammar(str(error)) from None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


class _Emitter:
    def __init__(self, prefix: str, repeats: Repeats, grammar: Lark) -> None:
        self.prefix = prefix
        self.repeats = repeats
        self.terminals = {terminal.name: terminal for terminal in grammar.terminals}
        self.expansions: dict[str, list[list[Any]]] = defaultdict(list)
        for rule in grammar.rules:
            self.expansions[rule.origin.name].append(list(rule.expansion))
        self.ignored = list(grammar.ignore_tokens)
        self.names: dict[tuple[bool, str], str] = {}
        self.taken: set[str] = set()

    def name(self, symbol_name: str, terminal: bool) -> str:
        key = (terminal, symbol_name)
        if key not in self.names:
            base = f"{self.prefix}-{'t' if terminal else 'r'}-{_NAME_CHARS.sub('-', symbol_name).strip('-') or 'x'}"
            name, count = base, 1
            while name in self.taken:
                count += 1
                name = f"{base}-{count}"
            self.taken.add(name)
            self.names[key] = name
        return self.names[key]

    def emit(self) -> GbnfRules:
        if START not in self.expansions:
            raise Unsupported(f"it has no '{START}' rule")
        rules = {origin: self._without_left_recursion(origin, alternatives)
                 for origin, alternatives in self.expansions.items()}
        _refuse_indirect_left_recursion(rules)
        gap = f" {self.prefix}-ignored " if self.ignored else " "
        lines = []
        for origin, (bases, tails) in rules.items():
            body = " | ".join(self._sequence(alternative, gap) for alternative in bases)
            if tails:
                tail = " | ".join(self._sequence(alternative, gap) for alternative in tails)
                body = f"({body}) ({gap.strip() + ' ' if self.ignored else ''}({tail}))*"
            lines.append(f"{self.name(origin, False)} ::= {body}")
        used = sorted({symbol.name for alternatives in self.expansions.values() for alternative in alternatives
                       for symbol in alternative if symbol.is_term} | set(self.ignored))
        for terminal in used:
            lines.append(f"{self.name(terminal, True)} ::= {self._terminal(terminal)}")
        root = f"{self.prefix}-root"
        start = self.name(START, False)
        if self.ignored:
            ignored = " | ".join(self.name(terminal, True) for terminal in self.ignored)
            lines.append(f"{self.prefix}-ignored ::= ({ignored})*")
            lines.append(f"{root} ::= {self.prefix}-ignored {start} {self.prefix}-ignored")
        else:
            lines.append(f"{root} ::= {start}")
        return GbnfRules(root, tuple(lines))

    def _sequence(self, symbols: Sequence[Any], gap: str) -> str:
        if not symbols:
            return '""'
        return gap.join(self.name(symbol.name, symbol.is_term) for symbol in symbols).strip()

    def _terminal(self, name: str) -> str:
        terminal = self.terminals.get(name)
        if terminal is None:
            raise Unsupported(f"the terminal {name} is declared but never defined")
        pattern = terminal.pattern
        if isinstance(pattern, PatternStr):
            if not pattern.value:
                raise Unsupported(f"the terminal {name} is empty")
            return literal(pattern.value, ignore_case="i" in pattern.flags)
        return regex(pattern.to_regexp(), self.repeats)

    @staticmethod
    def _without_left_recursion(origin: str, alternatives: list[list[Any]]) -> tuple[list[list[Any]], list[list[Any]]]:
        """``origin``'s alternatives split into those that do not start with ``origin``
        (bases) and the rest of those that do (tails): ``origin ::= (bases) (tails)*``."""
        bases, tails = [], []
        for alternative in alternatives:
            if alternative and not alternative[0].is_term and alternative[0].name == origin:
                if len(alternative) > 1:
                    tails.append(alternative[1:])
            else:
                bases.append(alternative)
        if not bases:
            raise Unsupported(f"the rule {origin} never ends: each of its alternatives starts with itself")
        return bases, tails


def _refuse_indirect_left_recursion(rules: dict[str, tuple[list[list[Any]], list[list[Any]]]]) -> None:
    """Refuse a rule that can reach itself without consuming text (llama.cpp's grammar
    parser refuses such grammars, and a sampler would loop on them)."""
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for origin, (bases, _) in rules.items():
            if origin not in nullable and any(all(not s.is_term and s.name in nullable for s in alternative)
                                              for alternative in bases):
                nullable.add(origin)
                changed = True
    leading: dict[str, set[str]] = {}
    for origin, (bases, tails) in rules.items():
        firsts: set[str] = set()
        for alternative in [*bases, *tails] if origin in nullable else bases:  # a tail leads when bases can be empty
            for symbol in alternative:
                if symbol.is_term:
                    break
                firsts.add(symbol.name)
                if symbol.name not in nullable:
                    break
        leading[origin] = firsts
    for origin in rules:
        seen: set[str] = set()
        stack = list(leading[origin])
        while stack:
            current = stack.pop()
            if current == origin:
                raise Unsupported(f"the rule {origin} is left-recursive through other rules, "
                                  "which a grammar for generation cannot hold")
            if current not in seen:
                seen.add(current)
                stack.extend(leading.get(current, ()))
