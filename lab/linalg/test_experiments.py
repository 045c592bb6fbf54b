"""The findings of lab/linalg/experiments.py, asserted (float64, a few seconds on a CPU).

Not collected by CI (pyproject's testpaths are tests and docs): run
``pytest lab/linalg/test_experiments.py`` from the repository root.
"""

from __future__ import annotations

import numpy as np

from lab.linalg.experiments import digits_lost_by_shape, digits_lost_with_residual


def test_shape_does_not_matter_only_the_condition_number():
    """At cond 1e6 the normal equations lose about 11 of the 16 digits and QR about 5 (median of
    five seeds), whether A is square, a little taller than wide or a hundred times taller."""
    lost = digits_lost_by_shape(1e6, [(10, 10), (20, 10), (200, 10), (1000, 10)])
    ne, qr = lost["normal equations"], lost["QR"]
    assert np.ptp(ne) < 1.5 and np.ptp(qr) < 1.5  # within 1.5 digits across the shapes
    assert np.all(np.abs(ne - 11) < 1.5) and np.all(np.abs(qr - 5) < 1.5)


def test_a_large_residual_costs_qr_cond_squared_too():
    """With ||r|| = ||A x||, QR's error grows like u cond^2 (about 4 digits per factor 100 in
    cond), as the normal equations' does; with a zero residual like u cond (about 2). The steps
    are measured on random matrices, so they are tested with a margin: more than 3 against less
    than 2.5 (one BLAS gave 3.4 for the step from 1e4 to 1e6)."""
    conds = np.array([1e2, 1e4, 1e6])
    big = digits_lost_with_residual(conds, residual=1.0)
    zero = digits_lost_with_residual(conds, residual=0.0)
    assert big["QR"][2] - big["QR"][1] > 3 and zero["QR"][2] - zero["QR"][1] < 2.5
    assert big["QR"][2] > zero["QR"][2] + 3
    assert big["normal equations"][2] - big["normal equations"][1] > 3
