# jsmkt: `make demo` runs the main job, `make test` runs the test suite (each sets up .venv first).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
OUT    ?= out

.PHONY: venv demo test test-slow bench experiments clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[tests]"
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

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/fixed_point.py
	$(BIN)/python benchmarks/simulate.py
	$(BIN)/python benchmarks/replications.py
	$(BIN)/python benchmarks/general_service.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
