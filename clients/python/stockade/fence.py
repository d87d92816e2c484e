"""The fence as the framework providers see it: which egress grant an exec holds.

A Stockade exec is fenced (DESIGN §2.1): its grant exists only while it runs. A
framework's tools (the Agents SDK's `exec_command`, deepagents' `execute`) carry no
grant of their own, so a provider holds one in its options (the *default grant*,
applied to every exec of a session) and code can give the execs made inside a block
their own with `stockade_grant(rules)`. Standard library only: `import stockade` never
needs a framework.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping, Optional, Sequence

Rules = Sequence[Mapping[str, Any]]

# Unset: the session's default grant. Set (even to an empty list): that grant instead.
_override: contextvars.ContextVar[Optional[list[dict]]] = contextvars.ContextVar(
    "stockade_grant", default=None)
_set: contextvars.ContextVar[bool] = contextvars.ContextVar("stockade_grant_set", default=False)


@contextlib.contextmanager
def stockade_grant(rules: Optional[Rules]) -> Iterator[None]:
    """Every exec a provider makes inside this block (and in tasks started from it) holds
    ``rules`` instead of the session's default grant; ``None`` or ``[]``: no grant."""
    t1 = _override.set([dict(r) for r in rules] if rules else [])
    t2 = _set.set(True)
    try:
        yield
    finally:
        _set.reset(t2)
        _override.reset(t1)


def grant_for(default: Optional[Rules]) -> Optional[list[dict]]:
    """The grant one exec holds now: the block's own, else ``default``; ``None``: none."""
    if _set.get():
        return _override.get() or None
    return [dict(r) for r in default] if default else None


def denial_note(denials: int) -> str:
    """What an exec's stderr gains when the fence refused some of its requests: an agent
    reading the output learns the network was refused, not broken."""
    if not denials:
        return ""
    s = "" if denials == 1 else "s"
    return (f"\n[stockade] the egress fence denied {denials} egress request{s} of this "
            f"command (no grant for that host); see the sandbox's denials\n")
