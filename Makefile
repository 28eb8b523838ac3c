# Two commands a user needs: `make demo` and `make test`. Both install what is missing first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# This machine's device kind (requirements/machine.py): cpu, cuda (driver 580+: CUDA 13 builds) or
# cuda126 (an older driver: PyTorch's CUDA 12.6 builds). One stamp per kind: a .venv made on a CPU
# node of a shared home directory is rebuilt with CUDA wheels on a GPU node, and back.
KIND := $(shell $(PYTHON) requirements/machine.py kind)
STAMP := $(VENV)/.shardrec-setup-$(KIND)
DEMO := runs/demo
# Test files run on this many pytest-xdist workers (one file stays on one worker, so its module
# fixtures are built once): the multi-process tests leave a core idle while a rank imports torch.
TEST_WORKERS ?= 2

.PHONY: setup demo check test mutants gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/machine.py requirements/torch_index.py requirements/$(KIND).txt requirements/torchrec.txt requirements/torchrec-deps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/.shardrec-setup*
	$(BIN)/python -m pip install -q --upgrade pip
	# Another kind's torch and fbgemm-gpu(-cpu) go first: torch==X is satisfied by X+cpu, and
	# fbgemm-gpu must never land on top of fbgemm-gpu-cpu (one fbgemm_gpu folder for both).
	stale="$$($(BIN)/python requirements/machine.py stale $(KIND))"; \
		if [ -n "$$stale" ]; then $(BIN)/pip uninstall -y -q $$stale; fi
	# torch and torchrec's real dependencies in one resolve, then torchrec itself without its
	# CUDA fbgemm-gpu pin (installed last, so pip never sees a half-installed torchrec).
	$(BIN)/pip install -q $$($(BIN)/python requirements/machine.py index $(KIND)) \
		-r requirements/$(KIND).txt -r requirements/torchrec-deps.txt
	$(BIN)/pip install -q --no-deps -r requirements/torchrec.txt
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python requirements/machine.py check $(KIND)
	touch $(STAMP)

# synth -> preprocess -> plan -> train (2 CPU ranks via torchrun, on any machine) -> evaluate.
demo: setup
	rm -rf $(DEMO)
	$(BIN)/shardrec synth $(DEMO)/raw --rows 300000 --seed 7
	$(BIN)/shardrec preprocess $(DEMO)/raw/train.txt --out $(DEMO)/data --max-ids 50000
	$(BIN)/shardrec plan --data $(DEMO)/data --config configs/demo.toml --world-size 2 --topology cpu-gloo \
		--out $(DEMO)/plan.json
	$(BIN)/shardrec train --config configs/demo.toml --data $(DEMO)/data --plan $(DEMO)/plan.json --out-dir $(DEMO)/run --nproc-per-node 2

# The edit-test loop: format, lint and the one-process unit tests (well under 2 minutes on 2 cores).
check: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit

# Format and lint (ruff, pinned in the test extra), then the whole suite (what CI runs).
test: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

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
