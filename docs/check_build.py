"""What a built site must hold beyond ``sphinx -W`` (``make docs`` runs it after the build): a page
for every source page, every public name of both packages on its module's API page, and the figures
and result tables generated from the committed outputs on their pages.

    python docs/check_build.py [docs/_build/html]

Prints each problem and exits with status 1 if there is one. ``tests/test_docs_snippets.py`` runs
the pages' code and checks this checker on a site made to miss each thing; CI (``.ci/run``) runs
``make docs``, so every submission is built and checked.
"""

import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP_DIRS = {"_build", "_generated", "_static"}
PACKAGES = ("pyro_concrete", "numpyro_concrete")
EXAMPLE_PAGES = ("dvae", "structured", "mixture", "gmm", "hmm", "l0")


def source_pages(docs=HERE):
    """Every ``.rst`` page of the site's sources."""
    return sorted(p for p in docs.rglob("*.rst") if not SKIP_DIRS & set(p.relative_to(docs).parts))


def api_modules(docs=HERE):
    """The modules with an API page (``docs/api/<module>.rst``)."""
    return sorted(p.stem for p in (docs / "api").glob("*.rst") if p.stem != "index")


def problems(out, docs=HERE):
    """What the site built into ``out`` lacks, one line each (empty: nothing)."""
    out, found = Path(out), []
    for page in source_pages(docs):
        if not (out / page.relative_to(docs).with_suffix(".html")).exists():
            found.append(f"no page built for {page.relative_to(docs)}")
    for name in api_modules(docs):
        html = _read(out / "api" / f"{name}.html")
        for package in PACKAGES:
            module = importlib.import_module(f"{package}.{name}")
            found += [f"{package}.{name}.{public} has no entry on api/{name}.html" for public in module.__all__
                      if f'id="{package}.{name}.{public}"' not in html]
    if not (out / "_images" / "numerics_stability.png").exists() or "numerics_stability.png" not in _read(out / "numerics.html"):
        found.append("numerics.html does not show the generated numerics_stability.png")
    for page in EXAMPLE_PAGES:
        html = _read(out / "examples" / f"{page}.html")
        if not ("examples/results/" in html and "<table" in html and f"_images/{page}" in html):
            found.append(f"examples/{page}.html lacks its results table or its generated figure")
    return found


def _read(path):
    return path.read_text() if path.exists() else ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))  # the packages, when checked from a checkout
    out = argv[0] if argv else os.path.join(HERE, "_build", "html")
    found = problems(out)
    for line in found:
        print(f"docs/check_build.py: {line}")
    if not found:
        print(f"docs/check_build.py: {out} holds every page, API entry, figure and table")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
