"""The statistics of every study kind: pure numpy/scipy, no study vocabulary.

One package so that one rule holds everywhere (docs/science.md; the protocol's §2-§4); import its
names from here (``from studies.stats import holm``), its submodules hold the jobs:

* **Multiplicity** (:mod:`~studies.stats.multiplicity`): :func:`holm`, the only Holm step-down in
  the code base. Its rule: the family is the hypotheses whose p-value is defined; a ``None`` or NaN
  p-value is not in the family and stays ``None``; a p-value outside [0, 1] is an error. Tied p-values
  get the same adjusted value, so the order in which ties are visited does not matter.
* **Fixed designs**: paired contrasts with an exact sign-flip p (:func:`paired_contrast`), the
  within-seed permutation test of a trend (:func:`permutation_p_value`; both in
  :mod:`~studies.stats.randomisation`), t-intervals and a seed bootstrap (:func:`t_interval`,
  :func:`seed_interval`), the interval of a mean correlation on the Fisher-z scale
  (:func:`fisher_z_interval`, always inside [-1, 1]), one-sample t-tests (:func:`t_test_p`; in :mod:`~studies.stats.intervals`)
  and their power (:func:`power_of_t_test`, :func:`seeds_needed`; in :mod:`~studies.stats.power`),
  and for an estimate on the wrong side of its claim the seeds at which it would be given up
  (:func:`wrong_side`, :func:`seeds_to_futility`, :func:`futility_needs` for a family).
* **Sequential designs** (the protocol's §4; :mod:`~studies.stats.anytime`): the normal-mixture
  t-test, anytime-valid for unknown variance (Wang & Ramdas, arXiv 2310.03722, Thm 4.9; the
  ``safestats`` R package): :func:`mixture_log_e_values`, :func:`confidence_sequence`,
  :func:`sequential_test` for one hypothesis, :func:`sequential_family` for a family with Holm at
  every look and :func:`sequential_looks` to replay every planned look of a study from its per-seed
  values.

Every random draw comes from a ``numpy.random.Generator`` owned by the call; nothing seeds globally.
"""

from studies.stats._checks import Alternative
from studies.stats.anytime import (
    DECISIONS,
    confidence_sequence,
    expected_seeds,
    mixture_log_e_values,
    sequential_family,
    sequential_looks,
    sequential_test,
)
from studies.stats.intervals import (
    fisher_z_interval,
    mean_interval,
    ols_slope,
    seed_interval,
    t_interval,
    t_test_p,
)
from studies.stats.multiplicity import holm, holm_into
from studies.stats.power import futility_needs, power_of_t_test, seeds_needed, seeds_to_futility, wrong_side
from studies.stats.randomisation import (
    EXACT_PERMUTATION_LIMIT,
    log_n_permutations,
    min_sign_flip_p,
    paired_contrast,
    permutation_p_value,
    sign_flip_p,
)

__all__ = [
    "DECISIONS",
    "EXACT_PERMUTATION_LIMIT",
    "Alternative",
    "confidence_sequence",
    "expected_seeds",
    "fisher_z_interval",
    "futility_needs",
    "holm",
    "holm_into",
    "log_n_permutations",
    "mean_interval",
    "min_sign_flip_p",
    "mixture_log_e_values",
    "ols_slope",
    "paired_contrast",
    "permutation_p_value",
    "power_of_t_test",
    "seed_interval",
    "seeds_needed",
    "seeds_to_futility",
    "sequential_family",
    "sequential_looks",
    "sequential_test",
    "sign_flip_p",
    "t_interval",
    "t_test_p",
    "wrong_side",
]
