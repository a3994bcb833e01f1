# jsmkt: `make demo` runs the main job, `make test` runs the test suite (each sets up .venv first).
# Also: `make test-slow` (statistical checks), `make docs` (the documentation site, into out/site), `make experiments`
# (the papers' numerical sections, rewriting experiments/*/results; about 40 min), `make experiments-quick` (smoke
# runs into out/experiments), `make bench`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
OUT    ?= out
# Test processes (pytest-xdist): compilation, which dominates the suite, runs on one core per process. Each test
# module stays on one process (--dist loadfile), so that its tests share their compiled shapes.
WORKERS ?= 2
PYTEST  = $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile

.PHONY: venv demo test test-slow docs bench experiments experiments-quick clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[tests]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/jsmkt solve examples/jsq2_h2.toml --plot $(OUT)/jsq2_h2_tails.png
	@echo
	$(BIN)/jsmkt solve examples/jsq2_erlang2.toml --format table --plot $(OUT)/jsq2_erlang2_exact.png
	@echo
	$(BIN)/jsmkt solve examples/jsq2_erlang2.toml --as-published --plot $(OUT)/jsq2_erlang2_published.png
	@echo
	$(BIN)/python examples/demo.py --out $(OUT)

# The layers first (pyproject.toml's import-linter contract: no import goes up), then the suite.
test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(PYTEST)

test-slow: $(STAMP)
	$(PYTEST) -m slow

# The documentation site (mkdocs.yml, docs/), built with warnings as errors; the docs extra joins the venv.
SITE ?= $(OUT)/site
docs: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[docs]"
	$(BIN)/mkdocs build --strict --site-dir $(SITE)

bench: $(STAMP)
	$(BIN)/python benchmarks/fixed_point.py
	$(BIN)/python benchmarks/simulate.py
	$(BIN)/python benchmarks/replications.py
	$(BIN)/python benchmarks/general_service.py
	$(BIN)/python benchmarks/banded_solve.py
	$(BIN)/python benchmarks/batch_solve.py
	$(BIN)/python benchmarks/sojourn.py
	$(BIN)/python benchmarks/cli.py --profile
	$(BIN)/python benchmarks/compile_flags.py
	$(BIN)/python benchmarks/sweep.py

experiments: $(STAMP)
	$(BIN)/python experiments/verification/compute.py
	$(BIN)/python experiments/verification/finite_n.py
	$(BIN)/python experiments/verification/refined.py
	$(BIN)/python experiments/verification/plot.py
	$(BIN)/python experiments/mitzenmacher_table/compute.py
	$(BIN)/python experiments/mitzenmacher_table/refined.py
	$(BIN)/python experiments/refined/compute.py
	$(BIN)/python experiments/refined/plot.py
	$(BIN)/python experiments/retrial/compute.py
	$(BIN)/python experiments/retrial/plot.py
	$(BIN)/python experiments/repair/compute.py
	$(BIN)/python experiments/repair/plot.py
	$(BIN)/python experiments/framework/compute.py
	$(BIN)/python experiments/sizing/compute.py
	$(BIN)/python experiments/framework/bmap.py
	$(BIN)/python experiments/choice_numbers/compute.py
	$(BIN)/python experiments/choice_numbers/plot.py
	$(BIN)/python experiments/repair_allocation/compute.py
	$(BIN)/python experiments/repair_allocation/plot.py
	$(BIN)/python experiments/ph_fits/compute.py
	$(BIN)/python experiments/ph_fits/plot.py

experiments-quick: $(STAMP)
	$(BIN)/python experiments/verification/compute.py --quick
	$(BIN)/python experiments/verification/finite_n.py --quick
	$(BIN)/python experiments/verification/refined.py --quick
	$(BIN)/python experiments/verification/plot.py --quick
	$(BIN)/python experiments/mitzenmacher_table/compute.py --quick
	$(BIN)/python experiments/mitzenmacher_table/refined.py --quick
	$(BIN)/python experiments/refined/compute.py --quick
	$(BIN)/python experiments/refined/plot.py --quick
	$(BIN)/python experiments/retrial/compute.py --quick
	$(BIN)/python experiments/retrial/plot.py --quick
	$(BIN)/python experiments/retrial/validate.py --quick
	$(BIN)/python experiments/repair/compute.py --quick
	$(BIN)/python experiments/repair/plot.py --quick
	$(BIN)/python experiments/framework/compute.py --quick
	$(BIN)/python experiments/sizing/compute.py --quick
	$(BIN)/python experiments/framework/bmap.py --quick
	$(BIN)/python experiments/choice_numbers/compute.py --quick
	$(BIN)/python experiments/choice_numbers/plot.py --quick
	$(BIN)/python experiments/repair_allocation/compute.py --quick
	$(BIN)/python experiments/repair_allocation/plot.py --quick
	$(BIN)/python experiments/ph_fits/compute.py --quick
	$(BIN)/python experiments/ph_fits/plot.py --quick

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
