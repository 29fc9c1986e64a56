"""A log-space einsum whose gradient is exact: the backend (for opt_einsum, as
``pyro.ops.einsum.torch_log``) of :class:`ExactLogRing`, which the exact helpers sum out the
enumerated values with.

Pyro's ``torch_log`` shifts each operand by its own maximum, sums the products with ``torch.einsum``
and takes the log with ``safe_log``, whose gradient is ``1 / max(S, eps)``. Where the operands'
maxima lie at different values of a summed dimension (the prior favours one value, the likelihood
another, a few tens of nats apart) the sum S is below eps, and every gradient through it was scaled
down by S / eps while the value stayed right. Here the log's gradient is 1 / S; where S underflows
(below the dtype's smallest normal number, with a finite term: the sum has lost its digits) the
contraction is done again over the broadcast terms, shifted by their own maximum (memory: every
dimension's size multiplied). A sum whose terms are each -inf (a value ruled out) is -inf.
"""

import torch
from pyro.ops.einsum.util import Tensordot
from pyro.ops.rings import LogRing


def transpose(a, axes):
    return a.permute(axes)


def einsum(equation, *operands):
    """log sum exp of the broadcast sum of the operands, over the dimensions the output lacks."""
    symbols = sorted(set(equation) - set(",->"))  # torch.einsum takes letters only
    rename = dict(zip(symbols, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    equation = "".join(rename.get(s, s) for s in equation)
    inputs, output = equation.split("->")
    inputs = inputs.split(",")
    if any(len(set(dims)) != len(dims) for dims in inputs):
        raise NotImplementedError(f"a repeated dimension in one operand: {equation}")
    if inputs == [output]:
        return operands[0].clone()
    shifts, exp_operands = [], []
    for dims, operand in zip(inputs, operands):
        shift = operand.detach()
        for i, dim in enumerate(dims):
            if dim not in output:
                shift = shift.amax(i, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))  # no -inf - -inf
        exp_operands.append((operand - shift).exp())
        shifts.append(_aligned(shift.reshape([n for n, d in zip(operand.shape, dims) if d in output]),
                               [d for d in dims if d in output], output))
    summed = torch.einsum(equation, exp_operands)
    small = summed < torch.finfo(summed.dtype).tiny
    if bool(small.any()):  # host reads: the exact helpers only
        # a sum of terms that are each -inf (a value ruled out) is -inf, rightly; one with a finite
        # term has underflowed, and is taken again over the broadcast terms
        finite = torch.einsum(equation, [torch.isfinite(operand).to(summed.dtype) for operand in operands])
        if bool((small & (finite > 0)).any()):
            return _broadcast_logsumexp(inputs, output, operands)
    return sum(shifts) + _log(summed)


def _log(s):
    """log s, -inf with gradient 0 (not inf * 0) where s is 0."""
    positive = s > 0
    return torch.where(positive, torch.where(positive, s, torch.ones_like(s)).log(), torch.full_like(s, -float("inf")))


def _aligned(x, dims, output):
    """``x``, whose dimensions are ``dims`` (a subsequence of ``output``'s symbols, in any order),
    permuted and reshaped to broadcast against the output."""
    order = [dims.index(d) for d in output if d in dims]
    shape = [x.shape[dims.index(d)] if d in dims else 1 for d in output]
    return x.permute(order).reshape(shape)


def _broadcast_logsumexp(inputs, output, operands):
    """The contraction over the broadcast terms (memory: the product of every dimension's size)."""
    symbols = output + "".join(sorted(set("".join(inputs)) - set(output)))
    total = sum(_aligned(operand, dims, symbols) for dims, operand in zip(inputs, operands))
    summed = tuple(range(len(output), len(symbols)))
    if not summed:  # a product only (torch reduces over every dimension given none)
        return total
    top = total.detach().amax(summed, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    s = (total - top).exp().sum(summed, keepdim=True)  # 0 where every term is -inf
    return (top + _log(s)).reshape(total.shape[: len(output)])


tensordot = Tensordot(einsum)


class ExactLogRing(LogRing):
    """Pyro's log-space ring with this module's einsum."""

    _backend = "pyro_concrete._log_einsum"
