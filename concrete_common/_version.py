"""The version of the concrete-ppl distribution: the one place it is written.

pyproject.toml reads it (``[tool.setuptools.dynamic]``), and ``pyro_concrete.__version__`` and
``numpyro_concrete.__version__`` re-export it. Bump it together with CHANGELOG.md.
"""

__version__ = "0.1.0"
