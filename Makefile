# megnode — the two commands the README promises: `make test` and `make demo`.
# Everything runs inside .venv, created on first use and refreshed when
# pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# pytest-xdist workers for `make test`: the suite is half simulation (CPU) and half
# real daemons (waiting), so two workers use a 2-core machine; `make test TEST_WORKERS=0`
# runs it in one process.
TEST_WORKERS ?= 2

.PHONY: venv test test-packaging bench sweep demo clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> installing megnode and its dev dependencies into $(VENV) (first run takes a few minutes)"
	$(PY) -m pip install --quiet --upgrade pip
	# .[dev] includes .[analytics] (pyspark, pandas, matplotlib): make test and make demo
	# run the analytics; `pip install megnode` alone is the node (pyproject.toml).
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# lint-imports first: the layering contract ([tool.importlinter] in pyproject.toml)
# is part of the suite, and a broken contract fails `make test` before pytest runs.
# pytest exits 5 when it collected no test: that is a failure here, never a pass.
# The packaging test (a wheel into a fresh venv, 1-2 min) is left to `make test-packaging`.
test: venv
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "not packaging" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# `pip install megnode` without extras in a fresh venv (the node runs, `analyze` names the
# extra), and the slim Docker image where a Docker daemon answers (skipped otherwise).
test-packaging: venv
	$(PY) -m pytest -q -p no:cacheprovider -m packaging -rs tests/e2e; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-packaging: no test collected" >&2; exit 1; fi; exit $$rc

bench: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/bench -s; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make bench: no benchmarks collected" >&2; exit 1; fi; exit $$rc

# Issue 11's seeded world over 200 seeds (CI runs a few): 100 nodes, 10% loss, a healed
# partition, one misbehaving peer, two crashes; prints one line per seed and exits 1 if any failed.
sweep: venv
	$(PY) -m transport.sim --seed 0 --nodes 100 --loss 0.1 --rounds 10 --writers 3 \
		--partition-at 500 --heal-at 2000 --adversary --crashes 2 --sweep 200

demo: venv
	$(PY) -m deploy.demo

clean:
	rm -rf $(VENV) bench-results demo-output .pytest_cache
