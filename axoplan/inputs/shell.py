"""What a job script may hold and how a value is written into it: each rule defined once.

A machine YAML's launcher block (axoplan.inputs.launcher) is checked against these rules when the YAML
is read, the user's site values when they are given; the exporter (axoplan.export.script) writes with
:func:`quote_for` and :func:`scan_shell` and checks nothing again.

- **A directive word** (:data:`DIRECTIVE_WORD`): a value in a scheduler directive (an ``#SBATCH``,
  ``#PBS`` or ``# flux:`` line), where nothing can be quoted: letters, digits and ``_ . : + / @ -``, not
  starting with ``-`` (it would read as an option). Accounts, partitions, QOS and queues are always
  directive words.
- **A module word** (:data:`MODULE_WORD`): what ``module load`` / ``module use`` take unquoted.
- **Shell-safe text** (:func:`unsafe_text`): a path or an image that the script writes quoted; it may hold
  spaces and ``; & |``, but no quotes, ``$``, backquotes, backslashes or control characters, which would
  end or expand inside the quotes whatever the quoting.
- **The quoting** (:func:`quote_for`): outside quotes ``shlex.quote`` (the Python library's POSIX shell
  quoting); inside double or single quotes the value as it is, when it holds nothing that ends or expands
  there.

Sources: bash(1) "QUOTING" (what ends or expands inside single and double quotes, ``$( )`` and
backquotes starting a new level); sbatch(1) "#SBATCH" lines (options parsed as a command line without a
shell, so a space splits and a leading ``-`` starts an option); Python's ``shlex.quote``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["DIRECTIVE_WORD", "DIRECTIVE_WORD_RULE", "MODULE_WORD", "MODULE_WORD_RULE", "has_control",
           "directive_word_problem", "unsafe_text", "ShellPiece", "scan_shell", "quote_for", "Unquotable"]

DIRECTIVE_WORD: Final = re.compile(r"[A-Za-z0-9_.:+/@][A-Za-z0-9_.:+/@-]*")
"""A value that may stand in a scheduler directive line."""
DIRECTIVE_WORD_RULE: Final = "letters, digits and _ . : + / @ - (not starting with -)"
""":data:`DIRECTIVE_WORD` in words, for messages."""
MODULE_WORD: Final = re.compile(r"[A-Za-z0-9_.:+/@%,=-]+")
"""A module name, or a module path to add, written unquoted after ``module load`` / ``module use``."""
MODULE_WORD_RULE: Final = "letters, digits and _ . : + / @ % , = -"
""":data:`MODULE_WORD` in words, for messages."""

_IN_QUOTES: Final = {"'": "'", '"': '"$`\\'}
"""What ends or expands inside single and inside double quotes (bash(1), QUOTING)."""
_UNSAFE: Final = frozenset("\"'$`\\")
"""What no quoting holds in every place a site value may stand: both quotes, ``$``, backquote, backslash."""


def has_control(text: str) -> bool:
    """Whether `text` holds a line break or another control character (ASCII 0-31, 127)."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def directive_word_problem(value: str) -> str | None:
    """Why `value` cannot stand in a scheduler directive (None: it can)."""
    if DIRECTIVE_WORD.fullmatch(value):
        return None
    return f"may hold only {DIRECTIVE_WORD_RULE}"


def unsafe_text(value: str) -> str | None:
    """What makes `value` unfit for a job script whatever the quoting (None: nothing)."""
    if has_control(value):
        return "a line break or other control character"
    if any(c in _UNSAFE for c in value):
        return "quotes, '$', backquotes or backslashes"
    return None


@dataclass(frozen=True, slots=True)
class ShellPiece:
    """One step of a shell line: a character, an escaped pair (``\\x``), ``$(``, or a span the caller keeps
    whole (a ``{placeholder}``); `context` is the quoting in force where it starts: '' unquoted, "'" or '"'
    inside quotes, '(' inside ``$( )`` or ``( )``, '`' inside backquotes."""

    start: int
    text: str
    context: str
    kept: bool = False


def scan_shell(text: str, quote: str = "", keep: Callable[[int], int | None] | None = None
               ) -> tuple[list[ShellPiece], str]:
    """`text` split into :class:`ShellPiece` with the quoting each stands in, and the quoting at its end.

    `quote` is the quoting the text starts in ('"': written inside double quotes); `keep(i)` returns the
    end of a span starting at `i` to pass over whole, without reading quotes in it (None: no span there).
    A backslash escapes the next character except inside single quotes; ``$(`` and backquotes open a new,
    unquoted level, also inside double quotes (bash(1), QUOTING). More closing quotes than opening ones
    (a text that starts inside quotes and closes them) go on as unquoted.
    """
    stack = [quote]
    pieces: list[ShellPiece] = []
    i = 0
    while i < len(text):
        end = keep(i) if keep is not None else None
        if end is not None:
            pieces.append(ShellPiece(i, text[i:end], stack[-1], kept=True))
            i = end
            continue
        context = stack[-1]
        step = _step(text, i, stack)
        pieces.append(ShellPiece(i, text[i:i + step], context))
        i += step
        if not stack:
            stack.append("")
    return pieces, stack[-1]


def _step(text: str, i: int, stack: list[str]) -> int:
    """Update the quoting `stack` for the character at `i`; return how many characters it spans."""
    c, top = text[i], stack[-1]
    if top == "'":
        if c == "'":
            stack.pop()
        return 1
    if c == "\\":
        return 2
    if c == "$" and text.startswith("$(", i):
        stack.append("(")
        return 2
    if c == "`":
        if top == "`":
            stack.pop()
        else:
            stack.append("`")
    elif top == '"':
        if c == '"':
            stack.pop()
    elif c in "'\"(":
        stack.append(c)
    elif c == ")" and top == "(":
        stack.pop()
    return 1


class Unquotable(ValueError):
    """A value that no quoting can write where it stands (it holds what ends or expands there)."""


def quote_for(value: str, context: str = "", *, nested: bool = False) -> str:
    """`value` written so the shell reads it back as one plain word where it stands (`context`, as in
    :class:`ShellPiece`).

    Unquoted (also inside ``$( )`` and backquotes): ``shlex.quote(value)``, or, when `nested` (the line
    runs inside ``bash -c '...'``, where shlex's single quotes would end the outer ones), in double quotes; a
    single quote in the value would end them too, which shell-safe text (:func:`unsafe_text`) never holds.
    Inside quotes: the value as it is. Raises :class:`Unquotable` when the value holds what ends or
    expands inside the quotes it would be written in, or a control character.
    """
    wrap = context in ("", "(", "`")
    if wrap and not nested:
        return shlex.quote(value)
    if wrap and shlex.quote(value) == value:
        return value
    inside = '"' if wrap else context
    if has_control(value):
        raise Unquotable("a control character")
    if any(c in _IN_QUOTES[inside] for c in value):
        raise Unquotable("a quote, $, backquote or backslash")
    return f'"{value}"' if wrap else value
