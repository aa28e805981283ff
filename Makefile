# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.blockx-installed
# The packages holding setup.py's NATIVE_MODULES (mypyc), and the build's stamp.
NATIVE_SOURCES := setup.py $(wildcard src/blockx/worker/core/*.py src/blockx/worker/actor/*.py src/blockx/worker/link/*.py \
	src/blockx/worker/io/*.py src/blockx/executor/*.py src/blockx/wire/*.py src/blockx/cli/calls_file.py)
NATIVE_STAMP   := src/blockx/_native_build.json

.PHONY: setup system-deps test test-fast demo lint bench clean

setup: $(STAMP) $(NATIVE_STAMP)

# PostgreSQL (blockdb tests) and bubblewrap (sandbox mode), when root + apt-get can
# install them; elsewhere a no-op, and the tests that need them skip with a reason.
system-deps:
	@sh scripts/install-system-deps.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,dev]'
	@touch $(STAMP)

# A source of those packages changed since the build: compile again (a stale
# build runs the sources, slower: blockx.native). ~8 min, so it says so first,
# and how long it took after.
$(NATIVE_STAMP): $(NATIVE_SOURCES) | $(STAMP)
	@case "$$BLOCKX_PURE_PYTHON" in \
	  ""|0) echo "compiling the hot paths with mypyc, ~8 min on 2 cores; BLOCKX_PURE_PYTHON=1 skips it" ;; \
	  *) echo "installing without the compiled build (BLOCKX_PURE_PYTHON=$$BLOCKX_PURE_PYTHON)" ;; \
	esac
	@start=$$(date +%s); \
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . || exit $$?; \
	echo "build done in $$(( $$(date +%s) - start )) s"

# The whole suite, slow end-to-end tests included, on the compiled modules; then
# the tests of the compiled packages again on their pure-Python sources (what runs
# without a compiler; and the few tests only an interpreted module allows). Two
# pytest-xdist workers, one per core of the machines we run on (TEST_JOBS=1: one).
TEST_JOBS ?= 2
test: setup system-deps
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS)
	BLOCKX_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) \
		-m "not slow or interpreted_check" tests/core tests/wire tests/executor tests/worker tests/io

# Everything but the tests marked slow.
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) -m "not slow"

# The quickstart task (examples/quickstart/); its table store goes to examples/.data/ (git-ignored).
demo: setup
	$(VENV)/bin/blockx run examples/quickstart/task.yaml

lint: $(STAMP)
	$(PY) -m ruff check setup.py src tests bench examples
	$(PY) -m ruff format --check setup.py src tests bench examples
	$(PY) -m mypy src/blockx

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache .mypy_cache
	find src -name '*.so' -delete; rm -f $(NATIVE_STAMP)
