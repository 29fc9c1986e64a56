"""What both packages share, in one place: pyro_concrete and numpyro_concrete import it.

Backend-neutral only -- it imports neither torch nor JAX: the names of the test-time modes and of
the carried coordinates (``kinds``), the error messages and the checks that read plain numbers
(``messages``, ``stretch``, ``schedules``). The numerics and the PPL idioms stay in each package.
Not a public API: users import ``pyro_concrete`` or ``numpyro_concrete``.
"""

from ._version import __version__  # noqa: F401  (written there alone; pyproject.toml reads it)
