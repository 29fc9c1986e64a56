# Two commands on a fresh machine:  make test  /  make demo (the discrete VAE on the 8x8 digits)
# make docs: the Sphinx site in docs/_build/html, warnings as errors, then docs/check_build.py on it
# make types: mypy on the packages (settings in pyproject.toml)
# make release-check: build the wheel and sdist, install the wheel in a fresh venv, run the README there
# make compat: the conformance subset in fresh venvs with the oldest and the newest versions (tools/compat.py)
# make test-here: the suite in the environment that runs it (no venv, no install: the hosts already there)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel on these machines. It goes in first, so that pyro-ppl's unpinned torch requirement
# is already satisfied (an unpinned torch pulls several GB of CUDA packages).
TORCH := torch==2.13.0

.PHONY: test test-here types demo docs release-check compat clean

$(STAMP): pyproject.toml Makefile concrete_common/_version.py  # the version: the installed metadata reads it
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[pyro,numpyro,test,examples,docs]"  # TFP (".[bench]") only for the benchmarks
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal tests

test-here:
	$(PYTHON) -m pytest -n 2 --dist worksteal tests

# mypy reads torch's hints, 20-30 s: a step of CI (.ci/run) beside the suite, as the hosts lint
types: $(STAMP)
	$(BIN)/python -m mypy

compat:
	$(PYTHON) tools/compat.py

demo: $(STAMP)
	$(BIN)/python -m examples.dvae_numpyro

docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	$(BIN)/python docs/check_build.py docs/_build/html

release-check: $(STAMP)
	$(BIN)/python tools/release_check.py --torch "$(TORCH)"

clean:
	rm -rf $(VENV) .compat .pytest_cache .hypothesis *.egg-info docs/_build docs/_generated
