"""A fast end for each xdist worker, so that it is never interrupted while it tears down.

When the last worker reports that its tests are done, the controller asks every worker to exit
and execnet gives each 5 s: a worker still running then is sent SIGINT
(``execnet.gateway_base.WorkerGateway._terminate_execution``). After a worker's tests, pytest
collects garbage twice (its unraisable-exception plugin, in ``pytest_unconfigure`` and in a
cleanup), and each full collection walks every object the worker still holds: 1.5-1.7 million
objects, about 2 s apiece on this machine, more on a slower or busier one. A SIGINT that arrives
during a collection is raised in the first Python code that runs after it, Hypothesis's
``gc.callbacks`` timer, where it cannot propagate: pytest then prints a ``KeyboardInterrupt``
traceback from Hypothesis as a ``PytestUnraisableExceptionWarning`` after an all-passed run.

So each worker collects once and freezes what survives (``gc.freeze``) before it reports that
it is done (xdist sends ``workerfinished`` after the other ``pytest_sessionfinish``
implementations): the collections after that walk only what is made during teardown."""

import gc
import os


def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.collect()  # what pytest's own collection would have found (unraisable exceptions included)
        gc.freeze()
