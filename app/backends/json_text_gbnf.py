"""GBNF for text written inside a JSON string: literals, character sets and regular
expressions, each as the escaped form a model writes between the quotes.

A local model writes a custom tool's input as the string ``input`` of a JSON object
(:mod:`app.backends.call_syntax`), so a grammar that holds that input to a language must
hold the *encoded* text: a newline of the language is ``\\n`` between the quotes, a
quote ``\\"``, a backslash ``\\\\``. Every expression made here matches exactly the JSON
encodings of the strings of its language that a model is allowed to write: characters
other than ``"``, ``\\`` and U+0000..U+001F raw, those as their short escapes
(``\\" \\\\ \\b \\f \\n \\r \\t``), and the other control characters as ``\\u00XX``
(either case of hex digit).

Regular expressions are read with Python's own regex parser (``re._parser``, the one
``re.compile`` uses), so they mean what they mean to Python, with two approximations:
``\\d`` and ``\\w`` are ASCII (``[0-9]``, ``[0-9A-Za-z_]``; so ``\\D`` and ``\\W`` also
admit non-ASCII digits and letters), and case-insensitive matching folds ASCII letters
and small ranges only. What cannot be a context-free rule over characters is refused
(:class:`Unsupported`): anchors, look-arounds, back-references, atomic groups and
possessive repeats. A repeat count is held to the limits of :class:`Repeats`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

from app.backends.call_syntax import gbnf_literal

Ranges = list[tuple[int, int]]
"""Code points as sorted, disjoint, inclusive ranges."""

MAX_CODE_POINT = 0x10FFFF
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_ESCAPED: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_CASE_FOLDED_RANGE = 1_000
"""A range of a case-insensitive class larger than this is taken as it is."""


class Unsupported(ValueError):
    """A construct that cannot become GBNF; the message says which."""


class Repeats:
    """The repeat counts of one grammar: each at most ``each``, ``total`` in all (the
    size of a grammar, and of llama.cpp's expansion of it, grows with them)."""

    def __init__(self, each: int, total: int) -> None:
        self.each = each
        self.total = total
        self.spent = 0

    def spend(self, count: int) -> None:
        if count > self.each:
            raise Unsupported(f"a repetition of {count:,} times; at most {self.each:,} can be enforced")
        self.spent += count
        if self.spent > self.total:
            raise Unsupported(f"repetition counts that add up to more than {self.total:,}")


def normalized(ranges: Iterable[tuple[int, int]]) -> Ranges:
    merged: Ranges = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            if high > merged[-1][1]:
                merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return merged


_SPACE: Ranges = normalized((code, code) for code in range(0x3001) if chr(code).isspace())
"""What ``\\s`` matches (``str.isspace``: none above U+3000)."""


def complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return out


def _minus(ranges: Ranges, removed: Ranges) -> Ranges:
    return complement(normalized([*complement(ranges), *removed]))


def _contains(ranges: Ranges, code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


def _class_char(code: int) -> str:
    char = chr(code)
    if char.isascii() and (char.isalnum() or char in " !#$%&'()*+,./:;<=>?@_`{|}~"):
        return char
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _class_body(ranges: Ranges) -> str:
    return "".join(_class_char(low) if low == high else f"{_class_char(low)}-{_class_char(high)}"
                   for low, high in ranges)


def _gbnf_class(ranges: Ranges) -> str:
    """One character of ``ranges`` as a GBNF class, written the shorter way."""
    positive, negative = f"[{_class_body(ranges)}]", f"[^{_class_body(complement(ranges))}]"
    return positive if len(positive) <= len(negative) else negative


def literal(text: str, *, ignore_case: bool = False) -> str:
    """The JSON encoding of ``text``; with ``ignore_case``, of any casing of it."""
    if not text:
        return '""'
    if not ignore_case:
        return gbnf_literal(json.dumps(text, ensure_ascii=False)[1:-1])
    parts: list[str] = []
    run = ""
    for char in text:
        variants = _case_variants(ord(char))
        if len(variants) == 1:
            run += char
            continue
        if run:
            parts.append(literal(run))
            run = ""
        parts.append(char_set([(code, code) for code in variants]))
    if run:
        parts.append(literal(run))
    return " ".join(parts)


def char_set(ranges: Iterable[tuple[int, int]]) -> str:
    """One character of ``ranges``, JSON-encoded, as a GBNF expression."""
    ranges = normalized(ranges)
    if not ranges:
        raise Unsupported("a character class that matches no character")
    alternatives = []
    safe = _minus(ranges, _ESCAPED)
    if safe:
        alternatives.append(_gbnf_class(safe))
    short = [letter for code, letter in _SHORT_ESCAPES.items() if _contains(ranges, code)]
    if short:
        letters = "".join("\\" + letter if letter in '"\\' else letter for letter in short)
        alternatives.append(f'"\\\\" [{letters}]')
    for high in (0, 1):
        lows = [code & 0xF for code in range(high * 16, high * 16 + 16)
                if code not in _SHORT_ESCAPES and _contains(ranges, code)]
        if lows:
            digits = "".join(sorted({f"{low:x}" for low in lows} | {f"{low:X}" for low in lows}))
            alternatives.append(f'"\\\\u00{high}" [{digits}]')
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _case_variants(code: int) -> list[int]:
    char = chr(code)
    return sorted({code, *(ord(v) for v in (char.lower(), char.upper(), char.swapcase()) if len(v) == 1)})


def _case_folded(ranges: Ranges) -> Ranges:
    folded = list(ranges)
    for low, high in ranges:
        if high - low < _CASE_FOLDED_RANGE:
            folded += [(v, v) for code in range(low, high + 1) for v in _case_variants(code)]
    return normalized(folded)


def regex(pattern: str, repeats: Repeats) -> str:
    """The JSON encoding of the strings Python's ``re.fullmatch(pattern, ...)`` matches, as
    a GBNF expression; ``Unsupported`` for a pattern that is not one (a syntax error) or
    that uses a construct listed in the module docstring."""
    try:
        parsed = sre_parse.parse(pattern, 0)
    except (re.error, RecursionError, OverflowError) as error:
        raise Unsupported(f"the regular expression /{pattern}/ is not valid: {error}") from None
    return _Regex(repeats).sequence(parsed, parsed.state.flags)


class _Regex:
    """One parsed regular expression made into GBNF (see :func:`regex`)."""

    def __init__(self, repeats: Repeats) -> None:
        self.repeats = repeats

    def sequence(self, items: Sequence[tuple[object, object]], flags: int) -> str:
        parts: list[str] = []
        run: list[str] = []
        for op, av in items:
            if op is sre.LITERAL and not flags & re.IGNORECASE:
                run.append(chr(av))  # type: ignore[arg-type]
                continue
            if run:
                parts.append(literal("".join(run)))
                run = []
            parts.append(self.item(op, av, flags))
        if run:
            parts.append(literal("".join(run)))
        return " ".join(parts) if parts else '""'

    def item(self, op: object, av: object, flags: int) -> str:
        ignore_case = bool(flags & re.IGNORECASE)
        if op is sre.LITERAL:
            return char_set(_case_folded([(av, av)]))  # type: ignore[list-item]
        if op is sre.NOT_LITERAL:
            excluded = normalized([(av, av)])  # type: ignore[list-item]
            return char_set(complement(_case_folded(excluded) if ignore_case else excluded))
        if op is sre.ANY:
            return char_set(complement([]) if flags & re.DOTALL else complement([(0x0A, 0x0A)]))
        if op is sre.IN:
            return char_set(self.in_set(av, ignore_case))  # type: ignore[arg-type]
        if op is sre.BRANCH:
            _, branches = av  # type: ignore[misc]
            return "(" + " | ".join(self.sequence(branch, flags) for branch in branches) + ")"
        if op is sre.SUBPATTERN:
            _, added, removed, inner = av  # type: ignore[misc]
            return "(" + self.sequence(inner, (flags | added) & ~removed) + ")"
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, inner = av  # type: ignore[misc]
            return f"({self.sequence(inner, flags)}){self.quantifier(low, high)}"
        raise Unsupported(f"{_construct(op)} cannot be enforced by a grammar")

    def quantifier(self, low: int, high: int) -> str:
        unbounded = high == sre.MAXREPEAT
        self.repeats.spend(low)
        if not unbounded:
            self.repeats.spend(high)
        if unbounded:
            return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
        if (low, high) == (0, 1):
            return "?"
        return f"{{{low}}}" if low == high else f"{{{low},{high}}}"

    @staticmethod
    def in_set(items: Sequence[tuple[object, object]], ignore_case: bool) -> Ranges:
        negate = False
        ranges: Ranges = []
        for op, av in items:
            if op is sre.NEGATE:
                negate = True
            elif op is sre.LITERAL:
                ranges.append((av, av))  # type: ignore[arg-type]
            elif op is sre.RANGE:
                ranges.append(av)  # type: ignore[arg-type]
            elif op is sre.CATEGORY:
                ranges += _category(av)
            else:
                raise Unsupported(f"{_construct(op)} in a character class cannot be enforced by a grammar")
        ranges = _case_folded(normalized(ranges)) if ignore_case else normalized(ranges)
        return complement(ranges) if negate else ranges


def _category(category: object) -> Ranges:
    positive = {sre.CATEGORY_DIGIT: _DIGIT, sre.CATEGORY_WORD: _WORD, sre.CATEGORY_SPACE: _SPACE}
    negative = {sre.CATEGORY_NOT_DIGIT: _DIGIT, sre.CATEGORY_NOT_WORD: _WORD, sre.CATEGORY_NOT_SPACE: _SPACE}
    if category in positive:
        return positive[category]  # type: ignore[index]
    if category in negative:
        return complement(normalized(negative[category]))  # type: ignore[index]
    raise Unsupported(f"the character category {category} cannot be enforced by a grammar")


_NAMES = {"AT": "an anchor (^, $, \\b, \\A, \\Z)", "GROUPREF": "a back-reference",
          "GROUPREF_EXISTS": "a conditional group", "ASSERT": "a look-ahead or look-behind",
          "ASSERT_NOT": "a negative look-ahead or look-behind", "ATOMIC_GROUP": "an atomic group",
          "POSSESSIVE_REPEAT": "a possessive repeat"}


def _construct(op: object) -> str:
    return _NAMES.get(str(op), str(op))
