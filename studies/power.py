"""How many seeds a study needs: the power of a one-sample t-test over per-seed values.

Used by ``autonorm-study plan --pilot``: a few pilot seeds give per-seed values of the quantity the
study tests (e.g. one arm's per-seed slope of the metric over batch size, or a per-seed paired
difference); :func:`seeds_needed` turns their mean and spread into the smallest number of seeds K
for which a one-sample t-test of K such values reaches the requested power.

Statistical model (docs/science.md has the study's confirmatory tests):

* the K per-seed values are i.i.d. normal with mean ``effect`` and standard deviation ``sd``;
* the test is the one-sample t-test of mean 0 at level ``alpha / family_size``. With ``family_size``
  arms tested together and Holm's step-down correction, the first (smallest) p-value is compared
  with ``alpha / family_size``: planning for that Bonferroni level is what the first Holm step needs,
  and is conservative for the later steps (whose levels are larger);
* its power is exact under that model, from the noncentral t distribution: the statistic
  ``T = mean / (s / sqrt(K))`` follows ``nct(df = K - 1, nc = |effect| / sd * sqrt(K))``.

The effect is a magnitude in the direction of the alternative: for ``"less"`` a true mean of
``-|effect|``, for ``"greater"`` ``+|effect|``. The pilot's sign is not checked: the question answered is
"how many seeds to detect an effect this large, if it is there". The pilot's own sd is used as if
it were the true one; with few pilot seeds it is itself uncertain, so treat K as a lower bound.

The functions live in :mod:`studies.stats` (the one statistics module); this module keeps their
earlier import path.
"""

from __future__ import annotations

from studies.stats import Alternative, power_of_t_test, seeds_needed

__all__ = ["Alternative", "power_of_t_test", "seeds_needed"]
