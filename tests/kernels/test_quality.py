"""Shuffle quality metrics, the seed's table in Levanter mode, and the strong default's chi-squared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meshbatch
from meshbatch.shuffles.quality import chi2_battery, inversion_count, random_expectations, shuffle_metrics

U32 = jnp.uint32

# blockwise-shuffle-plan.md, "Aggregate Shuffle Metrics" (perm_type=feistel, mean over PRNGKey(0..7)),
# n=8192, io_block_size=128, window_blocks=8, era_length=1024.
SEED_TABLE = {
    "full": (0.3325, 0.4997, 0.0010, 0.0107),
    "era": (0.0417, 0.0625, 0.9844, 0.3106),
    "block": (0.3319, 0.4980, 0.0088, 0.3063),
}
N, IO, WINDOW, ERA = 8192, 128, 8, 1024


def make_shuffle(strategy: str, key, compat):
    if strategy == "full":
        return meshbatch.permutation("feistel", N, key, compat=compat)
    if strategy == "era":
        return meshbatch.era_shuffle(N, era_length=ERA, key=key, compat=compat)
    return meshbatch.block_shuffle(N, io_block_size=IO, window_blocks=WINDOW, key=key, compat=compat)


def mean_metrics(strategy: str, compat) -> np.ndarray:
    x = jnp.arange(N, dtype=U32)
    rows = []
    for seed in range(8):
        perm = np.asarray(make_shuffle(strategy, jax.random.PRNGKey(seed), compat)(x))
        m = shuffle_metrics(perm, IO)
        rows.append(
            [m.mean_abs_displacement_norm, m.inversion_fraction, m.spearman_rho, m.same_block_transition_rate]
        )
    return np.mean(rows, axis=0)


def test_worked_example():
    m = shuffle_metrics(np.array([2, 0, 3, 1]), io_block_size=2)
    assert m.mean_abs_displacement_norm == pytest.approx(0.5)
    assert m.same_block_transition_rate == 0.0
    assert m.inversion_fraction == pytest.approx(3 / 6)


def test_inversion_count_equals_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 17, 300):
        perm = rng.permutation(n)
        brute = sum(int(perm[i] > perm[j]) for i in range(n) for j in range(i + 1, n))
        assert inversion_count(perm, chunk=7) == brute


@pytest.mark.parametrize("strategy", list(SEED_TABLE))
def test_levanter_mode_reproduces_the_seed_table(strategy):
    np.testing.assert_allclose(mean_metrics(strategy, "levanter"), SEED_TABLE[strategy], atol=0.002)


def test_strong_full_shuffle_scores_like_random():
    expected = random_expectations(N, IO)
    got = mean_metrics("full", None)
    assert got[0] == pytest.approx(expected["mean_abs_displacement_norm"], abs=0.003)
    assert got[1] == pytest.approx(0.5, abs=0.003)
    assert abs(got[2]) < 0.01
    assert got[3] == pytest.approx(expected["same_block_transition_rate"], abs=0.002)


# Central 99.9% of chi2 with 225 degrees of freedom (Wilson-Hilferty): where a random order lands.
CHI2_225_LOW, CHI2_225_HIGH = 161.6, 301.4


@pytest.mark.parametrize("n", [1 << 16, 100_003])
def test_chi2_battery_strong_default_within_random_range(n):
    x = jnp.arange(n, dtype=U32)
    for seed in range(4):
        reference = chi2_battery(np.random.default_rng(seed).permutation(n))
        strong = chi2_battery(np.asarray(meshbatch.permutation("feistel", n, jax.random.PRNGKey(seed))(x)))
        levanter = chi2_battery(
            np.asarray(meshbatch.permutation("feistel", n, jax.random.PRNGKey(seed), compat="levanter")(x))
        )
        for name in strong:
            assert CHI2_225_LOW < reference[name] < CHI2_225_HIGH, "the reference itself is random"
            assert CHI2_225_LOW < strong[name] < CHI2_225_HIGH, f"strong {name}={strong[name]:.0f}"
            # Levanter's affine rounds fail at least one of the two statistics badly.
        assert not all(CHI2_225_LOW < v < CHI2_225_HIGH for v in levanter.values()), levanter
