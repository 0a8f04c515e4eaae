"""``kind: seedspread``: how far one arm's final metric moves from seed to seed at a fixed learning rate.

A study kind installed from its own package (``pyproject.toml``: the entry point
``autonorm_studies.kinds: seedspread``), built only from autonorm-studies' public pieces: the
contract (:mod:`studies.contract`), the kinds' shared modules (:mod:`studies.kinds.study_runner`,
:mod:`studies.kinds.records`, :mod:`studies.kinds.outcome`), the shared spec
sections (:mod:`studies.schema.arms`) and the reporting helpers. It tests no hypothesis
(``study_verdict: none``): it measures, per arm, the mean, standard deviation and range of the
metric over the seeds, which is what a researcher looks at before choosing a seed count.
"""
