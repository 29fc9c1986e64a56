"""The documentation's code runs, and the documentation builds.

* Every Python code block of ``docs/**/*.rst`` (``.. code-block:: python``, ``.. code:: python``,
  ``.. sourcecode:: python`` and ``>>>`` doctest blocks) is executed: the blocks of one page in
  order, in one namespace per page, failing on any exception. A page's blocks run with JAX's x64
  mode off, as a user runs them. There are no illustrative-only Python blocks: a block that is not
  meant to run must not be Python (``bash``, ``text``), and every ``code-block`` names its language
  (``docs/conf.py`` sets the default highlighting to plain text, so a bare ``::`` block is not
  shown as Python).
* There is one API page per public module, and ``docs/check_build.py``, which ``make docs`` runs on
  the build (``sphinx -W``: every warning an error; CI runs it), names whatever a built site lacks
  (a page, a public name's API entry, a generated figure or table). The build itself, 20-30 s, is
  left to ``make docs``.
"""

import importlib
import importlib.util
import re
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

# the build itself (sphinx -W, 20-30 s) is CI's ``make docs``, which runs docs/check_build.py on it
_spec = importlib.util.spec_from_file_location("check_build", DOCS / "check_build.py")
check_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_build)

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
    assert check_build.api_modules() == sorted(API_MODULES) and check_build.source_pages() == PAGES


def _site(out, skip=()):
    """A stand-in for a built site holding what the checker looks for, but for ``skip``."""
    for page in PAGES:
        path = out / page.relative_to(DOCS).with_suffix(".html")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    for name in API_MODULES:
        entries = "".join(f'id="{package}.{name}.{public}"' for package in ("pyro_concrete", "numpyro_concrete")
                          for public in importlib.import_module(f"{package}.{name}").__all__
                          if f"{package}.{name}.{public}" not in skip)
        (out / "api" / f"{name}.html").write_text(entries)
    (out / "_images").mkdir(exist_ok=True)
    if "figure" not in skip:
        (out / "_images" / "numerics_stability.png").write_bytes(b"png")
    (out / "numerics.html").write_text("numerics_stability.png")
    for page in check_build.EXAMPLE_PAGES:
        table = "" if page in skip else "<table"
        (out / "examples" / f"{page}.html").write_text(f"examples/results/ {table} _images/{page}")


def test_the_build_checker_names_each_thing_a_site_lacks(tmp_path):
    """docs/check_build.py (run by ``make docs`` on the real build) passes a site with everything,
    and names what one lacks: a page, a public name's API entry, the generated figure, an example's
    results table."""
    _site(tmp_path / "whole")
    assert check_build.problems(tmp_path / "whole") == []
    _site(tmp_path / "missing", skip={"numpyro_concrete.losses.VIMCO", "figure", "hmm"})
    (tmp_path / "missing" / "quickstart.html").unlink()
    assert check_build.problems(tmp_path / "missing") == [
        "no page built for quickstart.rst",
        "numpyro_concrete.losses.VIMCO has no entry on api/losses.html",
        "numerics.html does not show the generated numerics_stability.png",
        "examples/hmm.html lacks its results table or its generated figure",
    ]
