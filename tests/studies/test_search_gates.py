"""The gate measurements of the AutoNorm claims study: the DyT depth slope (claim c), collapse epochs (claim d)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies.kinds.search.gates import collapse_epochs, dyt_depth_slope
from studies.stats import paired_contrast

# -- gate depth slope (claim c) ------------------------------------------------------------------------------


def test_dyt_depth_slope_is_the_per_seed_ols_slope() -> None:
    rng = np.random.default_rng(2)
    weights = {s: 0.3 + 0.05 * np.arange(6) + rng.normal(0, 0.03, 6) for s in range(7)}
    res = dyt_depth_slope(weights)
    expected = {s: np.polyfit(np.arange(6), w, 1)[0] for s, w in weights.items()}
    assert res["slopes"] == pytest.approx(expected, abs=1e-12)
    slopes = np.array(list(expected.values()))
    assert res["estimate"] == pytest.approx(slopes.mean())
    ref = paired_contrast(slopes, np.zeros(7), alternative="greater")
    assert res["ci"] == pytest.approx(ref["ci"]) and res["p_value"] == ref["p_value"] == 1 / 2**7
    with pytest.raises(ValueError, match="same number"):
        dyt_depth_slope({0: [0.1, 0.2], 1: [0.1, 0.2, 0.3]})


# -- collapse epochs (claim d) -------------------------------------------------------------------------------


def test_collapse_epochs_per_layer_with_never_counted() -> None:
    # 4 epochs, 2 layers. Layer 0 collapses to LN at epochs 2, 3 and never (seed 2: it collapses onto
    # DyT, LN weight 0.1). Layer 1 never collapses in seed 0 (entropy stays high).
    high, low = 0.6, 0.05
    entropy = {
        0: [[high, high], [low, high], [low, high], [low, high]],
        1: [[high, high], [high, low], [low, low], [low, low]],
        2: [[high, high], [low, low], [low, low], [low, low]],
    }
    ln = {
        0: [[0.5, 0.5], [0.9, 0.5], [0.9, 0.5], [0.9, 0.5]],
        1: [[0.5, 0.5], [0.5, 0.8], [0.9, 0.8], [0.9, 0.8]],
        2: [[0.5, 0.5], [0.1, 0.9], [0.1, 0.9], [0.1, 0.9]],
    }
    res = collapse_epochs(entropy, ln, eps=0.1)
    layer0, layer1 = res["layers"]
    assert layer0["epochs"] == {0: 2.0, 1: 3.0, 2: None}
    assert layer1["epochs"] == {0: None, 1: 2.0, 2: 2.0}
    assert (layer0["n_never"], layer1["n_never"]) == (1, 1)
    assert layer0["median"] == 3.0 and layer1["median"] == 2.0  # "never" ranks above every epoch
    assert layer0["ci"] == [2.0, None]  # 3 seeds: [min, max], max is "never"
    assert layer0["ci_coverage"] == pytest.approx(0.75)
    assert res["per_seed_median"] == {0: None, 1: 2.5, 2: None}
    json.dumps(res, allow_nan=False)
    strict = collapse_epochs(entropy, ln, eps=0.01)  # nothing falls below 0.01
    assert all(layer["n_never"] == 3 for layer in strict["layers"])


def test_collapse_epochs_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="same seeds"):
        collapse_epochs({0: [[0.1]]}, {1: [[0.9]]})
    with pytest.raises(ValueError, match="n_epochs, n_layers"):
        collapse_epochs({0: [[0.1, 0.2]]}, {0: [[0.9]]})
