# Two commands on a fresh machine:  make test  /  make demo (the discrete VAE on the 8x8 digits)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel on these machines. It goes in first, so that pyro-ppl's unpinned torch requirement
# is already satisfied (an unpinned torch pulls several GB of CUDA packages).
TORCH := torch==2.13.0

.PHONY: test demo clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[pyro,numpyro,test,examples]"  # TFP (".[bench]") only for the benchmarks
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal tests

demo: $(STAMP)
	$(BIN)/python -m examples.dvae_numpyro

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
