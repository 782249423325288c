"""Multiple comparisons: Holm's step-down adjustment (a campaign's experiments, a job's ranks)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def holm(p_values: Sequence[float]) -> tuple[float, ...]:
    """Holm-adjusted p-values, in the order given.

    Rejecting where the adjusted value is below alpha keeps the family-wise error rate at alpha
    for any dependence between the tests. A NaN (no test possible) counts as 1.
    """
    m = len(p_values)
    clean = [1.0 if math.isnan(p) else min(1.0, max(0.0, p)) for p in p_values]
    order = sorted(range(m), key=lambda i: clean[i])
    adjusted = [1.0] * m
    running = 0.0
    for position, i in enumerate(order):
        # Step-down: the running maximum keeps the adjusted values in the order of the raw ones.
        running = max(running, min(1.0, (m - position) * clean[i]))
        adjusted[i] = running
    return tuple(adjusted)
