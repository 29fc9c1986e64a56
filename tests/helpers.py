"""Tolerances and statistical tests shared by the conformance tests.

Statistical tests are seeded. Each asserts at significance ``ALPHA`` = 1e-5 per check and makes at
most a handful of checks, so a correct implementation fails a test with probability below 1e-4
over seeds; the sample sizes give them power against the bugs they target (see each test).
"""

import numpy as np
from scipy import stats

ALPHA = 1e-5

# log_prob against the float64 reference at the same point
RTOL = {"float32": 1e-4, "float64": 1e-10}


def assert_close(actual, expected, dtype, rtol=None):
    """|actual - expected| <= rtol * max(1, |expected|), elementwise; infinities must agree exactly."""
    rtol = RTOL[dtype] if rtol is None else rtol
    actual, expected = np.broadcast_arrays(np.asarray(actual, np.float64), np.asarray(expected, np.float64))
    assert not np.isnan(actual).any(), "NaN in actual"
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(actual[~finite], expected[~finite])
    error = np.abs(actual[finite] - expected[finite])
    bound = rtol * np.maximum(1.0, np.abs(expected[finite]))
    worst = np.argmax(error - bound) if error.size else None
    assert np.all(error <= bound), (
        f"max excess error {error[worst]:.3g} > {bound[worst]:.3g} at expected {expected[finite][worst]:.6g}"
    )


def assert_ks(samples, cdf, what=""):
    """One-sample Kolmogorov-Smirnov test of ``samples`` against the callable ``cdf``."""
    result = stats.kstest(np.ravel(samples), cdf)
    assert result.pvalue > ALPHA, f"KS {what}: statistic {result.statistic:.4g}, p = {result.pvalue:.3g}"


def _pool_small_cells(counts, expected):
    """Merge the cells with the smallest expected counts until every cell expects at least 5."""
    order = np.argsort(expected)
    pooled = np.cumsum(expected[order]) < 5
    pooled[np.argmin(pooled)] = True  # include the cell that brings the pool to >= 5
    if pooled.sum() <= 1:
        return counts, expected
    keep = order[~pooled]
    return (np.append(counts[keep], counts[order[pooled]].sum()), np.append(expected[keep], expected[order[pooled]].sum()))


def assert_frequencies(counts, probs, what=""):
    """Chi-square goodness of fit of category ``counts`` to ``probs``; cells expecting fewer than 5
    counts are pooled."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    top = np.argmax(probs)
    rest_expected = counts.sum() * (1 - probs[top])
    if rest_expected < 5:  # one category holds (almost) all the mass: exact Poisson tail instead
        rest = counts.sum() - counts[top]
        p_value = stats.poisson.sf(rest - 1, rest_expected)
        assert p_value > ALPHA, f"{what}: {rest} draws outside category {top}, expected {rest_expected:.3g}"
        return
    counts, expected = _pool_small_cells(counts, counts.sum() * probs)
    result = stats.chisquare(counts, expected)
    assert result.pvalue > ALPHA, f"chi-square {what}: counts {counts}, expected {expected.round(1)}, p = {result.pvalue:.3g}"


def assert_two_sample(samples_a, samples_b, what=""):
    result = stats.ks_2samp(np.ravel(samples_a), np.ravel(samples_b))
    assert result.pvalue > ALPHA, f"two-sample KS {what}: p = {result.pvalue:.3g}"


# ----------------------------------------------------------------------------- the examples' training loops


def loop_args(**options):
    """The options the examples' training loops read (``steps``, ``batch_size``, ``seed`` and any
    other given); no output directory, progress bar or evaluation."""
    import types

    defaults = dict(out=None, resume=False, no_progress=True, checkpoint_every=10**9, eval_every=None, binarize="dynamic")
    return types.SimpleNamespace(**{**defaults, **options})


def numpyro_dvae(units=8):
    """The dVAE example's SVI, compiled step and initial state on the 8x8 digits (small, linear
    networks), and the training images."""
    import jax
    import jax.numpy as jnp
    import numpyro

    from examples import data, dvae_numpyro

    train = jnp.asarray(data.load("digits").train)
    vae = dvae_numpyro.DiscreteVAE([dvae_numpyro.NodeLayer(units, 2)], False, dvae_numpyro.PAPER_TEMPERATURES[2],
                                   train.mean(0), False)
    svi = dvae_numpyro.make_svi(vae, numpyro.optim.Adam(1e-3))
    step = dvae_numpyro.make_train_step(svi, "dynamic", jax.random.PRNGKey(1))
    return svi, step, svi.init(jax.random.PRNGKey(0), train[:64]), train
