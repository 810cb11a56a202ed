"""Reading a shipped op ledger in tests: a term list's value at given dimensions, and each op's calls in a scope."""

from __future__ import annotations

from collections import Counter

import numpy as np

from axoplan.cost.ledger import Ledger, Term


def value(terms: tuple[Term, ...], dims: dict[str, float]) -> float:
    """``Σ c · Π symbol^exponent`` of `terms` at `dims` (every GPU's share whole: one GPU of each group)."""
    return sum(t.coef * float(np.prod([dims[s] ** e for s, e in t.exps])) for t in terms)


def calls(ledger: Ledger, scope: str) -> Counter[str]:
    """How many times `scope` runs each op (its entries' counts summed by name)."""
    out: Counter[str] = Counter()
    for op in ledger.ops(scope):
        out[op.op] += op.count
    return out
