"""The parameter cases the generic conformance tests run over."""

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, log_softmax

N_ARY = ("Concrete", "ExpConcrete")
BINARY = ("BinConcrete", "LogitBinConcrete")
NAMES = N_ARY + BINARY


@dataclass(frozen=True)
class Case:
    name: str
    temperature: object  # a float, or a tuple broadcasting with the batch shape
    logits: tuple

    def __str__(self):
        t = self.temperature if np.isscalar(self.temperature) else "batch"
        return f"{self.name}-T{t}-{'x'.join(map(str, np.shape(self.logits))) or 'scalar'}"

    @property
    def n_ary(self):
        return self.name in N_ARY

    @property
    def logits_array(self):
        return np.asarray(self.logits, dtype=np.float64)

    @property
    def temperature_array(self):
        return np.asarray(self.temperature, dtype=np.float64)

    @property
    def batch_shape(self):
        param = self.logits_array.shape[:-1] if self.n_ary else self.logits_array.shape
        return np.broadcast_shapes(self.temperature_array.shape, param)

    @property
    def event_shape(self):
        return self.logits_array.shape[-1:] if self.n_ary else ()

    def make(self, backend, dtype="float64", **kwargs):
        t = self.temperature if np.isscalar(self.temperature) else self.temperature_array
        return backend.make(self.name, t, logits=self.logits_array, dtype=dtype, **kwargs)

    def points(self, n, dtype="float64", seed=0):
        """``n`` fixed interior points per batch element, representable in ``dtype`` (float64 array)."""
        rng = np.random.default_rng(seed)
        shape = (n,) + self.batch_shape + self.event_shape
        if self.name == "Concrete":
            x = np.exp(log_softmax(2 * rng.standard_normal(shape), axis=-1))
        elif self.name == "ExpConcrete":
            x = log_softmax(2 * rng.standard_normal(shape), axis=-1)
        elif self.name == "BinConcrete":
            x = expit(4 * rng.standard_normal(shape))
            x[0] = 1e-6
            x[-1] = 1 - 1e-6
        else:
            x = 5 * rng.standard_normal(shape)
            x[0], x[-1] = -50.0, 50.0
        return x.astype(dtype).astype(np.float64)


def _cases(names, specs):
    return [Case(name, t, logits) for name in names for t, logits in specs]


N_ARY_SPECS = [
    (0.5, (0.3, -1.2, 2.0)),
    (2 / 3, (0.0, 0.0, 0.0, 0.0, 0.0)),
    (0.1, (5.0, -5.0, 0.0, 1.0)),
    (1.0, ((0.5, -0.5), (2.0, 1.0))),
    ((0.3, 1.5), ((1.0, 2.0, 3.0), (0.0, -1.0, 4.0))),
    (0.05, (50.0, -50.0, 3.0, -3.0, 0.0, 10.0)),
]
BINARY_SPECS = [
    (0.5, (-3.0, 0.0, 2.5)),
    (2 / 3, 0.0),
    (0.1, (50.0, -50.0, 1.0)),
    ((0.3, 1.5, 4.0), (0.5,)),
    (2.0, ((1.0, -1.0), (0.2, 3.0))),
]
CASES = _cases(N_ARY, N_ARY_SPECS) + _cases(BINARY, BINARY_SPECS)
