"""What a float dtype resolves, from its machine epsilon and largest value (plain numbers): the
tolerance of the simplex checks and the bounds on logits. Both packages' constraints read these."""

import math


def simplex_tolerance(eps, num_categories):
    """How far a correctly computed point of the simplex may be from it: |Σ x - 1| and
    |logsumexp y| stay within a few ulps, growing with log K through the summation."""
    return 16 * eps * (1 + math.log2(max(num_categories, 2)))


def logits_bounds(eps, largest):
    """(largest |logits|, largest |logits| / temperature) accepted under validation.

    A sample is (logits + noise) / temperature, the noise of order 1. Once the rounding of
    logits + noise approaches it the noise is lost and the samples and their densities are wrong
    (float32 logits of 1e6, or of 1e9, a common mask, give wrong densities), so |logits| must stay
    below 2^(mantissa bits - 9): 16384 in float32, 8.8e12 in float64 (rounding 2^-9 there). And
    |logits| / temperature below the square root of the largest float (1.8e19 in float32), so that
    sums of K coordinates and their products with another temperature stay finite."""
    return 2.0 ** (-math.log2(eps) - 9), math.sqrt(largest)


def coldest_temperature(tiny, largest):
    """The smallest temperature accepted under validation in a dtype of smallest normal ``tiny``
    and largest value ``largest``: a sample's noise reaches -log(tiny) in magnitude (a uniform draw
    at the smallest normal number), and noise / temperature must stay within the bound on |logits| /
    temperature (:func:`logits_bounds`), or the samples overflow. With logits of 0 (a uniform
    prior) only this bound holds the temperature: 1e-40 in float32 gave NaN samples."""
    return -math.log(tiny) / math.sqrt(largest)
