# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.blockx-installed

.PHONY: setup system-deps test test-fast demo lint bench clean

setup: $(STAMP)

# PostgreSQL (blockdb tests) and bubblewrap (sandbox mode), when root + apt-get can
# install them; elsewhere a no-op, and the tests that need them skip with a reason.
system-deps:
	@sh scripts/install-system-deps.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,dev]'
	@touch $(STAMP)

# The whole suite, slow end-to-end tests included.
test: $(STAMP) system-deps
	$(PY) -m pytest -q -p no:cacheprovider

# Everything but the tests marked slow.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# The quickstart task (examples/quickstart/); its table store goes to examples/.data/ (git-ignored).
demo: $(STAMP)
	$(VENV)/bin/blockx run examples/quickstart/task.yaml

lint: $(STAMP)
	$(PY) -m ruff check src tests bench examples
	$(PY) -m ruff format --check src tests bench examples
	$(PY) -m mypy src/blockx

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache .mypy_cache
