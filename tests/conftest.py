import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker (the suite runs -n 2 on 2 cores): intra-op thread pools of torch,
    # OpenMP and XLA beside another worker only spin and wait.
    # Set before torch or JAX starts; the example subprocesses inherit it.
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")
    # XLA without LLVM's optimization passes: the suite's programs are small and mostly run once,
    # so compiling is most of their time (test_conditional.py's NumPyro half: 149 s -> 83 s); the
    # passes do not change the arithmetic (no fast-math on the CPU), only its speed.
    # (XLA stops reading XLA_FLAGS at a token that is not a flag: only flags here)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0")

import pytest  # noqa: E402

try:  # the Pyro half runs without JAX (CONCRETE_TEST_BACKENDS=pyro; make compat's newest-torch)
    import jax  # noqa: E402
except ImportError:
    jax = None
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.backends import BACKEND_NAMES, enable_x64, load_backend  # noqa: E402
from tests.worker_teardown import pytest_sessionfinish  # noqa: E402,F401  (a hook)

settings.register_profile(
    "conformance",
    derandomize=True,  # seeded: the same examples on every run
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("conformance")


@pytest.hookimpl(trylast=True)  # after the tmp_path plugin has made its factory
def pytest_configure(config):
    """One JAX compilation cache for the run, shared by the xdist workers and the example
    subprocesses they start (through the environment): a program compiled by one is loaded by the
    others, not compiled again. In the run's base temporary directory, so every run starts empty.
    Set before anything is compiled (JAX decides on first compilation whether to use it)."""
    base = config._tmp_path_factory.getbasetemp()
    directory = str((base.parent if hasattr(config, "workerinput") else base) / "jax-compilation-cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if jax is None:
        return
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="session", params=BACKEND_NAMES)
def backend(request):
    return load_backend(request.param)


@pytest.fixture(autouse=True)
def _fresh_state(request):
    """Each test starts from an empty parameter store (Pyro's is global)."""
    for name in ("backend", "backend_pair"):
        if name in request.fixturenames:
            value = request.getfixturevalue(name)
            for b in value if isinstance(value, tuple) else (value,):
                b.reset()


@pytest.fixture(autouse=True)
def _default_validation():
    """Each test starts with torch.distributions' default validation on, as a user's process does:
    torch's first ``torch.compile`` call turns it off for the whole process (docs/numerics.rst), so a
    test after a compiled one would run unchecked. (torch only where it is loaded already.)"""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.distributions.Distribution.set_default_validate_args(True)
    yield


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="session")
def backend_pair():
    """Both backends, for the cross-backend agreement tests."""
    return tuple(load_backend(name) for name in BACKEND_NAMES)


def _is_float32_case(request):
    callspec = getattr(request.node, "callspec", None)
    values = callspec.params.values() if callspec else ()
    def is_float32(v):
        return (isinstance(v, str) and v == "float32") or (isinstance(v, tuple) and any(is_float32(x) for x in v))

    return any(is_float32(v) for v in values)


@pytest.fixture(autouse=True)
def _jax_precision(request):
    """JAX's x64 mode for the test: off for the float32 cases (a parameter "float32"), as a float32
    user runs NumPyro, so that no float32 result depends on an x64 process; on for every other case
    (the float64 cases and the tests that build float64 arrays need it)."""
    if jax is None:
        yield
        return
    with enable_x64(not _is_float32_case(request)):
        yield


# The longest tests (10-30 s each: subprocesses, the benchmarks' smoke runs, the fuzz cases) start
# first. pytest-xdist hands out tests in collection order and rebalances by stealing queued ones; a
# long test that starts last holds the run's end on one core while the other idles. Only the order
# changes.
RUN_FIRST = (
    "tests/test_data_parallel.py::",
    "tests/test_bench.py::",
    "tests/test_fuzz_estimators.py::",
    "tests/test_docs_snippets.py::",
    "tests/test_examples.py::test_sigterm",
    "tests/test_examples.py::test_resume_gives",
    "tests/test_docs.py::",
)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(RUN_FIRST))  # stable: the rest keep their order
