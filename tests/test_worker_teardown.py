"""The suite's own xdist workers end fast (tests/worker_teardown.py): a worker that holds many
objects when its tests are done freezes them before it reports, so pytest's collections during
teardown do not walk them and execnet's SIGINT deadline is not reached."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAP = 1_000_000

CONFTEST = """
import gc, json, os
from tests.worker_teardown import pytest_sessionfinish  # noqa: F401
HEAP = []

def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with open(os.environ["TEARDOWN_REPORT"], "w") as f:
            json.dump({"frozen": gc.get_freeze_count(), "held": len(HEAP)}, f)
"""

TESTS = f"""
from hypothesis import given, strategies as st
import conftest

@given(st.integers())
def test_with_hypothesis(x):  # installs Hypothesis's gc callback in the worker
    assert x == x

def test_that_holds_a_heap():
    conftest.HEAP.extend([i] for i in range({HEAP}))
"""


def test_a_worker_freezes_what_it_holds_before_it_reports(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(ROOT), TEARDOWN_REPORT=str(report))
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "2 passed" in output and "KeyboardInterrupt" not in output and "Unraisable" not in output, output[-3000:]
    written = json.loads(report.read_text())
    assert written["held"] == HEAP
    # every list the worker holds (and the objects behind its modules) is out of reach of gc
    assert written["frozen"] > HEAP, written
