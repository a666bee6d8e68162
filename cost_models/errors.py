"""User-facing errors of the world model (asserts are for internal invariants only)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache


class AutoplanError(Exception):
    """Base of every error autoplan reports to its user (re-exported as ``autoplan.AutoplanError``).

    The message is one line whatever user text it quotes: control characters (a newline in a GPU name) are
    written as escapes, so no input can split an error over lines or forge a second one."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (one_line(args[0]),)
        super().__init__(*args)


def one_line(text: str) -> str:
    """``text`` with every non-printable character (newline, tab, ESC, lone surrogate ...) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


class ConfigError(AutoplanError, ValueError):
    """A value breaks a constraint. The message names the value, the constraint and, where there
    is one, what to do instead (``advice``) and the valid choices: ``tp=16 does not divide num_kv_heads=8; valid: 1, 2,
    4, 8``."""

    def __init__(self, message: str, *, valid: Iterable[object] | None = None, advice: str | None = None) -> None:
        self.valid = list(valid) if valid is not None else None
        self.reason = one_line(message)  # the broken rule alone, without advice or valid choices (to quote elsewhere)
        self.advice = one_line(advice) if advice else None  # e.g. another target: a note quoting reason adds its own
        if self.advice:
            message = f"{message}; {advice}"
        if self.valid:
            message = f"{message}; valid: {', '.join(_shown(v) for v in self.valid)}"
        super().__init__(message)


def _shown(value: object) -> str:
    """A valid choice as the user writes it: booleans as in JSON and on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def repeated_error(names: Iterable[object], unit: str) -> str | None:
    """``'x' given twice; give each UNIT once: a,x`` for the first of ``names`` given more than once, or None (the
    caller's message names the list). The one rule for list-valued inputs (``cuda_graph_scope``, ``recompute_modules``,
    ``calibrate --fit``): a repeat is a slip (another name was meant), never a request, so it is refused."""
    names = list(names)
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is None:
        return None
    times = names.count(repeated)
    once = ",".join(str(n) for n in dict.fromkeys(names))
    return f"{str(repeated)!r} given {'twice' if times == 2 else f'{times} times'}; give each {unit} once: {once}"


class InfeasibleError(AutoplanError):
    """No plan fits. ``hint`` says what would work (smallest cluster, largest batch)."""

    def __init__(self, message: str, *, hint: str | None = None, closest: object | None = None) -> None:
        self.hint = hint
        self.closest = closest
        super().__init__(message if hint is None else f"{message}. {hint}")


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n`` in ascending order."""
    return list(_divisors(n))


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    """O(sqrt n): cached, since the rules ask for the same counts' divisors once per candidate layout."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))
