"""Quiet under ``torch.jit.trace``.

Under tracing (Pyro's ``JitTrace_ELBO`` and the other ``Jit*`` losses) shapes are traced values, and
the shape logic and parameter checks of this package read them, as Pyro's own distributions do: the
trace is specialised to them and Pyro retraces when they change. The ``TracerWarning`` raised by
reading them says nothing a user can act on, so the helpers that read them silence it while tracing
(a filter installed at import would not do: test runners and ``catch_warnings`` blocks reset filters).
"""

import functools
import warnings

import torch


def quiet_under_trace(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not torch.jit.is_tracing():
            return fn(*args, **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            return fn(*args, **kwargs)

    return wrapper


@functools.lru_cache(maxsize=None)
def make_fx_keeps_detach():
    """Whether this torch's ``make_fx`` records ``detach`` in the graph it traces. Torch 2.14 records
    it as ``aten.alias``: autograd, run on the graph afterwards, then differentiates through every
    ``detach`` -- the surrogates of the score-function losses and straight-through values included --
    and the compiled VIMCO's guide gradients were wrong (its loss value right). Tracing above
    autograd (``pre_dispatch``) keeps it, but fails on Pyro's data-dependent checks."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x: x.detach())(torch.zeros(1))
    return any(node.target is torch.ops.aten.detach.default for node in graph.graph.nodes)


class GraphFunction:
    """``pyro.ops.jit.trace``'s parameter plumbing (Pyro's ``CompiledFunction``) around
    ``torch.compile`` instead of ``torch.jit.trace``: per signature of the call (the shapes, dtypes
    and devices of the tensor arguments, the other arguments' values), ``make_fx`` traces the
    function once into a graph of tensor operations whose inputs are the unconstrained parameters
    and the tensor arguments, and ``torch.compile`` compiles that graph with ``options``.

    Dynamo then sees the graph only, none of Pyro's Python: traced directly, Pyro's handlers break
    its graph at every sample site (it does not trace their ``TypedDict`` messages), and this
    package's carry of sample coordinates takes its traced path (:mod:`._carry`) under ``make_fx``.
    The restrictions are ``JitTrace_ELBO``'s: static structure, every parameter created on the
    first call; a new shape traces and compiles again."""

    def __init__(self, fn, options):
        self.fn, self.options = fn, dict(options)
        self.compiled = {}  # signature -> compiled graph
        self.param_names = None

    def __call__(self, *args, **kwargs):
        import pyro
        from pyro import poutine

        key = (_signature(args), _signature(sorted(kwargs.items())))
        if key not in self.compiled:
            from torch.fx.experimental.proxy_tensor import make_fx

            # tracing draws no random numbers of the call's own: the call draws what eager would
            with torch.random.fork_rng(devices=_cuda_devices(args)):
                with poutine.block(), poutine.trace(param_only=True) as capture:
                    self.fn(*args, **kwargs)
                names = sorted(capture.trace.nodes)
                if self.param_names is not None and names != self.param_names:
                    # a graph holds the parameters it did not take as inputs as constants: never trained
                    raise NotImplementedError(f"a compiled loss needs the same parameters at every call: the first call "
                                              f"had {self.param_names}, this one (new shapes) has {names}")
                self.param_names, fn = names, self.fn

                def replayed(*params_and_args):
                    constrained = {name: pyro.param(name) for name in names}  # their unconstrained values: the inputs
                    return poutine.replay(fn, params=constrained)(*params_and_args[len(names):], **kwargs)

                params = [pyro.param(name).unconstrained() for name in names]
                with pyro.validation_enabled(False):  # as pyro.ops.jit: value checks are data-dependent
                    graph = make_fx(replayed)(*params, *args)
            self.compiled[key] = torch.compile(graph, **self.options)
        # the compiled graph calls no pyro.param: the parameters are checked where each shape is traced
        return self.compiled[key](*[pyro.param(name).unconstrained() for name in self.param_names], *args)


def _cuda_devices(args):
    import pyro

    tensors = [a for a in args if torch.is_tensor(a)] + list(pyro.get_param_store().values())
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


def _signature(values):
    """What a traced graph is specialised to: tensors by shape, dtype and device, the rest by value."""
    signature = []
    for value in values:
        if isinstance(value, tuple):  # a keyword argument (name, value)
            signature.append(_signature(value))
        elif torch.is_tensor(value):
            signature.append(("tensor", tuple(value.shape), value.dtype, value.device, value.requires_grad))
        else:
            try:
                hash(value)
                signature.append(value)
            except TypeError:
                signature.append(("id", id(value)))
    return tuple(signature)
