"""The documentation's code runs, and the documentation builds.

* Every Python code block of ``docs/**/*.rst`` (``.. code-block:: python``, ``.. code:: python``,
  ``.. sourcecode:: python`` and ``>>>`` doctest blocks) is executed: the blocks of one page in
  order, in one namespace per page, failing on any exception. A page's blocks run with JAX's x64
  mode off, as a user runs them. There are no illustrative-only Python blocks: a block that is not
  meant to run must not be Python (``bash``, ``text``), and every ``code-block`` names its language
  (``docs/conf.py`` sets the default highlighting to plain text, so a bare ``::`` block is not
  shown as Python).
* ``python -m sphinx -W --keep-going -b html docs <tmp>`` succeeds (every warning is an error), and
  its API pages document every public name of both packages, module by module.
"""

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends import enable_x64

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_DIRS = {"_build", "_generated", "_static"}

PYTHON_LANGUAGES = {"python", "python3", "py", "pycon", "ipython"}
RUNNABLE_DIRECTIVE = re.compile(r"^(\s*)\.\. (code-block|code|sourcecode)::\s*(\S*)\s*$")


def _pages():
    return sorted(p for p in DOCS.rglob("*.rst") if not SKIP_DIRS & set(p.relative_to(DOCS).parts))


def _indent(line):
    return len(line) - len(line.lstrip())


def extract_blocks(text):
    """[(line number, language, source)] of the code blocks of a page, in order; doctest blocks
    (paragraphs starting with ``>>>``) as language "pycon" with the prompts removed."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = RUNNABLE_DIRECTIVE.match(lines[i])
        if match:
            base, language, start = len(match.group(1)), match.group(3), i + 1
            i += 1
            while i < len(lines) and lines[i].strip().startswith(":") and _indent(lines[i]) > base:
                i += 1  # the directive's options
            body = []
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
                body.append(lines[i])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            while body and not body[0].strip():
                body.pop(0)
            width = min((_indent(line) for line in body if line.strip()), default=0)
            blocks.append((start, language, "\n".join(line[width:] for line in body)))
            continue
        if lines[i].lstrip().startswith(">>>"):
            start, body = i + 1, []
            while i < len(lines) and lines[i].strip():
                stripped = lines[i].strip()
                if stripped.startswith((">>> ", "... ")) or stripped in (">>>", "..."):
                    body.append(stripped[4:])
                i += 1
            blocks.append((start, "pycon", "\n".join(body)))
            continue
        i += 1
    return blocks


PAGES = _pages()


def test_the_docs_have_pages_with_python_blocks():
    assert PAGES, "no docs/**/*.rst found"
    assert sum(1 for p in PAGES for _, language, _ in extract_blocks(p.read_text()) if language in PYTHON_LANGUAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_code_block_names_its_language(page):
    for line, language, _ in extract_blocks(page.read_text()):
        assert language, f"{page.relative_to(ROOT)}:{line}: a code block without a language"


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(language in PYTHON_LANGUAGES for _, language, _ in extract_blocks(p.read_text()))],
    ids=lambda p: str(p.relative_to(DOCS)),
)
def test_python_blocks_run(page):
    import jax

    namespace = {"__name__": f"docs_{page.stem}"}
    with enable_x64(False):
        for line, language, source in extract_blocks(page.read_text()):
            if language not in PYTHON_LANGUAGES:
                continue
            code = compile(source, f"{page.relative_to(ROOT)}:{line}", "exec")
            # an exception fails the test, with the page and line in its traceback
            exec(code, namespace)  # noqa: S102  (running the code is the point)


def test_extract_blocks_reads_options_doctests_and_nested_blocks():
    text = """Title
=====

.. code-block:: python
   :caption: a caption

   a = 1

   b = a + 1

Text.

>>> c = 3
>>> for i in range(2):
...     c += i

* A list item:

  .. code:: bash

     echo hi
"""
    blocks = extract_blocks(text)
    assert [(language, source) for _, language, source in blocks] == [
        ("python", "a = 1\n\nb = a + 1"),
        ("pycon", "c = 3\nfor i in range(2):\n    c += i"),
        ("bash", "echo hi"),
    ]


# ----------------------------------------------------------------------------- the build

API_MODULES = [
    "distributions", "straight_through", "hard_concrete", "limits", "constraints", "transforms", "handlers",
    "evaluation", "reparam", "losses", "estimators", "temperature",
]


def test_the_api_pages_cover_every_public_module():
    """One page per public module of both packages; the private ones (leading underscore) have none."""
    for package in ("pyro_concrete", "numpyro_concrete"):
        modules = {p.stem for p in (ROOT / package).glob("*.py") if not p.name.startswith("_")}
        assert modules == set(API_MODULES), modules ^ set(API_MODULES)
    assert {p.stem for p in (DOCS / "api").glob("*.rst")} == set(API_MODULES) | {"index"}


def test_the_docs_build_without_warnings(tmp_path):
    """One build (the suite runs under pytest-xdist: one test, so one build), then what it must hold:
    every page, every public name of both packages on its module's page, the generated figures and
    tables from the committed outputs."""
    for module in ("sphinx", "sphinx_rtd_theme"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install sphinx sphinx-rtd-theme): the docs build is not checked")
    out = tmp_path / "html"
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
         str(DOCS), str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 0, f"sphinx-build -W failed:\n{run.stdout[-5000:]}\n{run.stderr[-10000:]}"

    for page in PAGES:
        assert (out / page.relative_to(DOCS).with_suffix(".html")).exists(), page

    missing = []
    for name in API_MODULES:
        html = (out / "api" / f"{name}.html").read_text()
        for package in ("pyro_concrete", "numpyro_concrete"):
            module = importlib.import_module(f"{package}.{name}")
            missing += [f"{package}.{name}.{public}" for public in module.__all__
                        if f'id="{package}.{name}.{public}"' not in html]
    assert not missing, f"public names without an entry on their API page: {missing}"

    assert (out / "_images" / "numerics_stability.png").exists()
    assert "numerics_stability.png" in (out / "numerics.html").read_text()
    for page in ("dvae", "structured", "mixture", "gmm", "hmm", "l0"):
        html = (out / "examples" / f"{page}.html").read_text()
        assert "examples/results/" in html and "<table" in html and f"_images/{page}" in html, page
