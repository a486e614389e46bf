"""Group advantages against hand-computed values."""

import numpy as np
import pytest
from agentrl_trainers.advantages import compute_advantages, grpo_advantages, lite_ppo_advantages


def test_grpo_normalises_each_group_by_its_own_std():
    # group 0: mean 0.5, population std 0.5 -> (+-0.5) / 0.5 = +-1; group 1: all equal -> zeros
    adv = grpo_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0]])
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(adv[1], [0, 0], atol=0)


def test_lite_ppo_uses_group_mean_and_batch_std():
    # centred: [0.5, -0.5] and [1, -1, 0]; batch std = sqrt((.25 + .25 + 1 + 1 + 0) / 5) = sqrt(0.5)
    adv = lite_ppo_advantages([[1.0, 0.0], [3.0, 1.0, 2.0]])
    s = np.sqrt(0.5)
    np.testing.assert_allclose(adv[0], [0.5 / s, -0.5 / s], rtol=1e-5)
    np.testing.assert_allclose(adv[1], [1 / s, -1 / s, 0], rtol=1e-5, atol=1e-9)


def test_unknown_estimator_names_the_allowed_ones():
    with pytest.raises(ValueError, match="grpo"):
        compute_advantages([[1.0]], "ppo")  # type: ignore[arg-type]
