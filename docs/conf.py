"""Sphinx configuration of the concrete-ppl documentation.

Build (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Before anything is read, ``docs/figures.py`` writes the figures and the result tables of the pages
into ``docs/_generated/`` from the committed benchmark outputs (``bench/results/*.txt``) and the
committed example results (``examples/results/*.json``), so that every number and curve on the
pages comes from those files.
"""

import importlib.metadata
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the packages, when the docs are built from a checkout
sys.path.insert(0, HERE)  # figures.py

import figures  # noqa: E402

figures.main()

# -- project -------------------------------------------------------------------------------------

project = "concrete-ppl"
author = "the concrete-ppl authors"
copyright = "2025, " + author
release = importlib.metadata.version("concrete-ppl")
version = ".".join(release.split(".")[:2])

# -- general -------------------------------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", ".gitignore", "Thumbs.db", ".DS_Store"]
nitpicky = False
pygments_style = "sphinx"
highlight_language = "text"  # a bare "::" block is not Python: every Python block is a code-block that runs

# -- autodoc: the docstrings are reStructuredText with Sphinx field lists (:param x:) ------------------

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = False  # the hosts' own docstrings belong to the hosts' docs
# members defined in the packages' own classes, their private bases included (e.g. ``conditional_rsample``),
# but none of the hosts': every class in the public classes' MROs that the packages do not define
API_MODULES = [
    "distributions", "straight_through", "hard_concrete", "limits", "constraints", "transforms", "handlers",
    "evaluation", "reparam", "losses", "estimators", "temperature",
]
OURS = ("pyro_concrete", "numpyro_concrete", "concrete_common")


def _host_classes():
    names = set()
    for package in OURS[:2]:
        for name in API_MODULES:
            module = importlib.import_module(f"{package}.{name}")
            for obj in (getattr(module, public) for public in module.__all__):
                if isinstance(obj, type):
                    names |= {c.__name__ for c in obj.__mro__ if c.__module__.split(".")[0] not in OURS}
    return names


autodoc_default_options = {"members": True, "show-inheritance": True, "inherited-members": ",".join(sorted(_host_classes()))}
autoclass_content = "both"  # the class docstring and the constructor's, where it has one

# -- HTML ----------------------------------------------------------------------------------------

html_theme = "sphinx_rtd_theme"
html_theme_options = {"navigation_depth": 3, "collapse_navigation": False}
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_title = f"concrete-ppl {release}"
html_show_sourcelink = False


def _public_bases(app, name, obj, options, bases):
    """Show a class's bases without the packages' private ones (``_NaryConcrete`` -> ``TorchDistribution``)."""
    public = []
    for base in bases:
        for candidate in getattr(base, "__mro__", (base,)):
            if not getattr(candidate, "__name__", "").startswith("_"):
                if candidate not in public:
                    public.append(candidate)
                break
    bases[:] = public


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
