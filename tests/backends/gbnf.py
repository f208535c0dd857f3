"""A small recognizer of llama.cpp's GBNF, for tests of the grammars the server makes:
whether a text is in a grammar's language, without a model. It reads what llama.cpp's
grammar parser reads (rules, alternatives, literals, character classes with ranges and
negation, groups, ``* + ?`` and ``{m}``, ``{m,}``, ``{m,n}``, the escapes ``\\x \\u \\U
\\n \\r \\t \\\\ \\" \\[ \\]``, comments) and matches by memoized descent, every way at
once; like llama.cpp, it does not take left recursion."""

from __future__ import annotations

import sys
from dataclasses import dataclass

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX = {"x": 2, "u": 4, "U": 8}


@dataclass(frozen=True)
class Node:
    kind: str  # "lit", "class", "ref", "seq", "alt", "rep"
    value: object = None
    low: int = 0
    high: int | None = None


class Grammar:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, Node] = {}
        self._skip()
        while self.pos < len(text):
            name = self._name()
            self._skip()
            assert text.startswith("::=", self.pos), f"'::=' expected at {self.pos}: {text[self.pos:self.pos + 40]!r}"
            self.pos += 3
            self.rules[name] = self._alternatives(top=True)
            self._skip()

    # -- parsing -------------------------------------------------------------------------

    def _skip(self, newlines: bool = True) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "#":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.pos += 1
            elif char in " \t\r" or (newlines and char == "\n"):
                self.pos += 1
            else:
                return

    def _name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] == "-"):
            self.pos += 1
        assert self.pos > start, f"a name expected at {start}: {self.text[start:start + 40]!r}"
        return self.text[start:self.pos]

    def _char(self) -> str:
        char = self.text[self.pos]
        if char != "\\":
            self.pos += 1
            return char
        kind = self.text[self.pos + 1]
        if kind in _HEX:
            digits = self.text[self.pos + 2 : self.pos + 2 + _HEX[kind]]
            self.pos += 2 + _HEX[kind]
            return chr(int(digits, 16))
        self.pos += 2
        return _ESCAPES[kind]

    def _alternatives(self, top: bool = False) -> Node:
        options = [self._sequence(top)]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            options.append(self._sequence(top))
        return options[0] if len(options) == 1 else Node("alt", tuple(options))

    def _sequence(self, top: bool) -> Node:
        items: list[Node] = []
        while True:
            self._skip(newlines=not top)
            if top and self.pos < len(self.text) and self.text[self.pos] == "\n":
                break  # a rule ends with its line, outside parentheses
            if self.pos >= len(self.text) or self.text[self.pos] in "|)":
                break
            items.append(self._postfix(self._atom()))
        return items[0] if len(items) == 1 else Node("seq", tuple(items))

    def _atom(self) -> Node:
        char = self.text[self.pos]
        if char == '"':
            self.pos += 1
            out = []
            while self.text[self.pos] != '"':
                out.append(self._char())
            self.pos += 1
            return Node("lit", "".join(out))
        if char == "[":
            self.pos += 1
            negated = self.text[self.pos] == "^"
            self.pos += negated
            ranges = []
            while self.text[self.pos] != "]":
                low = self._char()
                high = low
                if self.text[self.pos] == "-" and self.text[self.pos + 1] != "]":
                    self.pos += 1
                    high = self._char()
                ranges.append((ord(low), ord(high)))
            self.pos += 1
            return Node("class", (negated, tuple(ranges)))
        if char == "(":
            self.pos += 1
            inner = self._alternatives()
            self._skip()
            assert self.text[self.pos] == ")", f"')' expected at {self.pos}"
            self.pos += 1
            return inner
        return Node("ref", self._name())

    def _postfix(self, node: Node) -> Node:
        while self.pos < len(self.text) and self.text[self.pos] in "*+?{":
            char = self.text[self.pos]
            self.pos += 1
            if char == "*":
                node = Node("rep", node, 0, None)
            elif char == "+":
                node = Node("rep", node, 1, None)
            elif char == "?":
                node = Node("rep", node, 0, 1)
            else:
                end = self.text.index("}", self.pos)
                low, comma, high = self.text[self.pos:end].partition(",")
                self.pos = end + 1
                node = Node("rep", node, int(low), (int(high) if high else None) if comma else int(low))
        return node

    # -- matching ------------------------------------------------------------------------

    def matches(self, text: str, root: str = "root") -> bool:
        """Whether the whole of ``text`` is in the language of ``root``."""
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))
        try:
            return len(text) in _Match(self.rules, text).ends(self.rules[root], 0)
        finally:
            sys.setrecursionlimit(limit)


class _Match:
    """Every position each node can end at from each position, memoized, for one text."""

    def __init__(self, rules: dict[str, Node], text: str) -> None:
        self.rules = rules
        self.text = text
        self.memo: dict[tuple[int, int], frozenset[int]] = {}

    def ends(self, node: Node, at: int) -> frozenset[int]:
        key = (id(node), at)
        if key not in self.memo:
            self.memo[key] = self._ends(node, at)
        return self.memo[key]

    def _ends(self, node: Node, at: int) -> frozenset[int]:
        text = self.text
        if node.kind == "lit":
            value = str(node.value)
            return frozenset({at + len(value)}) if text.startswith(value, at) else frozenset()
        if node.kind == "class":
            if at >= len(text):
                return frozenset()
            negated, ranges = node.value  # type: ignore[misc]
            inside = any(low <= ord(text[at]) <= high for low, high in ranges)
            return frozenset({at + 1}) if inside != negated else frozenset()
        if node.kind == "ref":
            return self.ends(self.rules[str(node.value)], at)
        if node.kind == "alt":
            return frozenset().union(*(self.ends(option, at) for option in node.value))  # type: ignore[attr-defined]
        if node.kind == "seq":
            positions = frozenset({at})
            for item in node.value:  # type: ignore[attr-defined]
                positions = frozenset().union(*(self.ends(item, p) for p in positions))
                if not positions:
                    break
            return positions
        inner: Node = node.value  # type: ignore[assignment]
        reached = frozenset({at}) if node.low == 0 else frozenset()
        positions = frozenset({at})
        count = 0
        while positions and (node.high is None or count < node.high):
            positions = frozenset().union(*(self.ends(inner, p) for p in positions))
            if node.high is None and count >= node.low:
                positions -= reached  # positions seen before lead nowhere new
            count += 1
            if count >= node.low:
                reached |= positions
        return reached
