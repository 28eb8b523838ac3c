# Two commands a user needs: `make demo` and `make test`. Both install what is missing first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shardrec-setup
DEMO := runs/demo

.PHONY: setup demo test mutants gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/torch_index.py requirements/cpu.txt requirements/cuda.txt requirements/torchrec.txt requirements/torchrec-deps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch and torchrec's real dependencies in one resolve, then torchrec itself without its
	# CUDA fbgemm-gpu pin (installed last, so pip never sees a half-installed torchrec).
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q -r requirements/cuda.txt -r requirements/torchrec-deps.txt; \
	else \
		$(BIN)/pip install -q $$($(BIN)/python requirements/torch_index.py requirements/cpu.txt) \
			-r requirements/cpu.txt -r requirements/torchrec-deps.txt; \
	fi
	$(BIN)/pip install -q --no-deps -r requirements/torchrec.txt
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# synth -> preprocess -> plan -> train (2 CPU ranks via torchrun) -> evaluate.
demo: setup
	rm -rf $(DEMO)
	$(BIN)/shardrec synth $(DEMO)/raw --rows 300000 --seed 7
	$(BIN)/shardrec preprocess $(DEMO)/raw/train.txt --out $(DEMO)/data --max-ids 50000
	$(BIN)/shardrec plan --data $(DEMO)/data --config configs/demo.toml --world-size 2 --out $(DEMO)/plan.json
	$(BIN)/shardrec train --config configs/demo.toml --data $(DEMO)/data --plan $(DEMO)/plan.json --out-dir $(DEMO)/run --nproc-per-node 2

# Format and lint (ruff, pinned in the test extra), then the tests.
test: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Mutation testing of the core modules (scripts/mutants.py; slow, not part of `make test` or CI):
# prints each module's kill rate. MUTANTS="order files" runs only those.
mutants: setup
	$(BIN)/pip install -q -e '.[test,mutants]'
	$(BIN)/python scripts/mutants.py $(MUTANTS)

# The CUDA path in one call (README, "GPU check"): GPU tests + bench train on CUDA, one summary
# last; installs nothing unless GPU_CHECK_WHEELS names carried wheels. Without CUDA: one line, fails.
gpu-check:
	scripts/gpu_check.sh

clean:
	rm -rf $(VENV) runs *.egg-info
