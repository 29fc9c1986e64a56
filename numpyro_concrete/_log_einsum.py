"""A log-space einsum whose sum does not underflow: the backend (for opt_einsum, in place of
``funsor.einsum.numpy_log``) of funsor's log-space contraction while ``marginal_log_likelihood``
sums out the enumerated values.

funsor's ``numpy_log`` shifts each operand by its own maximum, sums the products with ``einsum``
and takes the log. Where the operands' maxima lie at different values of a summed dimension (the
prior favours one value, the likelihood another, or two likelihood factors disagree) the sum S is
about e^-disagreement, and past about 87 nats in float32 (708 in float64) it underflows to 0: the
value was -inf and its gradient NaN. Here the log's gradient is 1 / S; where S underflows (below the
dtype's smallest normal number, with a finite term: the sum has lost its digits) the contraction is
done again over the broadcast terms, shifted by their own maximum (memory: every dimension's size
multiplied). A sum whose terms are each -inf (a value ruled out) is -inf, with gradient 0.

Safe under ``jit``, ``vmap`` and ``grad``: no Python branch on values; the broadcast contraction is
chosen with ``lax.cond`` (computed alongside where ``vmap`` batches the choice). Each contraction is
compiled once per equation and shapes, so eager calls are not retraced.
"""

import functools

import jax
import jax.numpy as jnp
from funsor.einsum.util import Tensordot


def transpose(a, axes):
    return jnp.transpose(a, axes)


def einsum(equation, *operands):
    """log sum exp of the broadcast sum of the operands, over the dimensions the output lacks."""
    inputs, output = equation.split("->")
    inputs = inputs.split(",")
    if any(len(set(dims)) != len(dims) for dims in inputs):
        raise NotImplementedError(f"a repeated dimension in one operand: {equation}")
    if inputs == [output]:
        return jnp.asarray(operands[0])
    return _einsum(equation, *operands)


@functools.partial(jax.jit, static_argnums=0)
def _einsum(equation, *operands):
    inputs, output = equation.split("->")
    inputs = inputs.split(",")
    operands = [jnp.asarray(operand) for operand in operands]
    dtype = jnp.result_type(*operands)
    shifts, exp_operands = [], []
    for dims, operand in zip(inputs, operands):
        shift = jax.lax.stop_gradient(operand)
        summed_axes = tuple(i for i, dim in enumerate(dims) if dim not in output)
        if summed_axes:
            shift = jnp.max(shift, axis=summed_axes, keepdims=True)
        shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))  # no -inf - -inf
        exp_operands.append(jnp.exp(operand - shift))
        shifts.append(_aligned(shift.reshape([n for n, d in zip(operand.shape, dims) if d in output]),
                               [d for d in dims if d in output], output))
    summed = jnp.einsum(equation, *exp_operands)
    fast = (sum(shifts) + _log(summed)).astype(dtype)
    # a sum of terms that are each -inf (a value ruled out) is -inf, rightly; one with a finite term
    # has underflowed, and is taken again over the broadcast terms
    small = summed < jnp.finfo(summed.dtype).tiny
    finite = jnp.einsum(equation, *[jnp.isfinite(operand).astype(summed.dtype) for operand in operands])
    underflowed = jnp.any(small & (finite > 0))
    return jax.lax.cond(
        underflowed,
        lambda fast, operands: _broadcast_logsumexp(inputs, output, operands).astype(dtype),
        lambda fast, operands: fast,
        fast,
        operands,
    )


def _log(s):
    """log s, -inf with gradient 0 (not inf * 0) where s is 0."""
    positive = s > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, s, jnp.ones_like(s))), jnp.full_like(s, -jnp.inf))


def _aligned(x, dims, output):
    """``x``, whose dimensions are ``dims`` (a subsequence of ``output``'s symbols, in any order),
    permuted and reshaped to broadcast against the output."""
    order = [dims.index(d) for d in output if d in dims]
    shape = [x.shape[dims.index(d)] if d in dims else 1 for d in output]
    return jnp.transpose(x, order).reshape(shape)


def _broadcast_logsumexp(inputs, output, operands):
    """The contraction over the broadcast terms (memory: the product of every dimension's size)."""
    symbols = output + "".join(sorted(set("".join(inputs)) - set(output)))
    total = sum(_aligned(operand, dims, symbols) for dims, operand in zip(inputs, operands))
    summed = tuple(range(len(output), len(symbols)))
    if not summed:  # a product only
        return total
    top = jax.lax.stop_gradient(jnp.max(total, axis=summed, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    s = jnp.exp(total - top).sum(summed, keepdims=True)  # 0 where every term is -inf
    return (top + _log(s)).reshape(total.shape[: len(output)])


tensordot = Tensordot(einsum)
