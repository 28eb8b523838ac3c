# Two commands a user needs: `make demo` and `make test`. Both install what is missing first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# This machine's device kind (requirements/machine.py): cpu, cuda (driver 580+: CUDA 13 builds) or
# cuda126 (an older driver: PyTorch's CUDA 12.6 builds). One stamp per kind: a .venv made on a CPU
# node of a shared home directory is rebuilt with CUDA wheels on a GPU node, and back.
# A node whose Python already holds a CUDA torch of a supported release (a GPU cluster's image)
# keeps it: .venv sees it (--system-site-packages) and gets only its fbgemm-gpu and torchrec.
SYSTEM_TORCH := $(shell $(PYTHON) requirements/machine.py system-torch)
KIND := $(or $(SYSTEM_TORCH),$(shell $(PYTHON) requirements/machine.py kind))
STAMP := $(VENV)/.shardrec-setup-$(KIND)
# Offline (a node without network): WHEELS, or SHARDREC_WHEELS, names a folder of wheels that
# `make wheels KIND=... WHEELS=...` (requirements/download_wheels.py) filled on a machine with
# network; pip then reads that folder only.
WHEELS ?= $(SHARDREC_WHEELS)
PIP_SOURCE := $(if $(WHEELS),--no-index --find-links $(abspath $(WHEELS)))
INSTALL_ARGS := install-args $(KIND) $(if $(SYSTEM_TORCH),system) $(if $(WHEELS),offline)
DEMO := runs/demo
# Test files run on this many pytest-xdist workers (one file stays on one worker, so its module
# fixtures are built once): the multi-process tests leave a core idle while a rank imports torch.
TEST_WORKERS ?= 2

.PHONY: setup wheels demo check test bench-check mutants gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/machine.py requirements/torch_index.py requirements/$(KIND).txt requirements/torchrec.txt requirements/torchrec-deps.txt
	test -x $(BIN)/python $(if $(SYSTEM_TORCH),&& grep -q 'system-site-packages = true' $(VENV)/pyvenv.cfg) \
		|| $(PYTHON) -m venv $(if $(SYSTEM_TORCH),--system-site-packages) $(VENV)
	rm -f $(VENV)/.shardrec-setup*
	$(if $(WHEELS),,$(BIN)/python -m pip install -q --upgrade pip)
	# Another kind's torch and fbgemm-gpu(-cpu) go first: torch==X is satisfied by X+cpu, and
	# fbgemm-gpu must never land on top of fbgemm-gpu-cpu (one fbgemm_gpu folder for both).
	stale="$$($(BIN)/python requirements/machine.py stale $(KIND))"; \
		if [ -n "$$stale" ]; then $(BIN)/pip uninstall -y -q $$stale; fi
	# torch and torchrec's real dependencies in one resolve, then torchrec itself without its
	# CUDA fbgemm-gpu pin (installed last, so pip never sees a half-installed torchrec).
	$(BIN)/pip install -q $(PIP_SOURCE) $$($(BIN)/python requirements/machine.py $(INSTALL_ARGS)) \
		-r requirements/torchrec-deps.txt
	$(BIN)/pip install -q $(PIP_SOURCE) --no-deps -r requirements/torchrec.txt
	$(BIN)/pip install -q $(PIP_SOURCE) -e '.[test]'
	# Bytecode for our modules, as pip writes it for an installed package: an editable install
	# under PYTHONDONTWRITEBYTECODE would compile them again in every process it starts.
	$(BIN)/python -m compileall -q embeddings sharding dataloader trainer tools
	$(BIN)/python requirements/machine.py check $(KIND)
	touch $(STAMP)

# The wheels `make setup WHEELS=DIR` installs on a node without network, downloaded here for
# KIND (cpu, cuda or cuda126; default: this machine's) and, with PYTHON_VERSION / PLATFORM, for a
# node of another Python or platform (requirements/download_wheels.py).
wheels:
	test -n "$(WHEELS)" || { echo "make wheels: name the folder: make wheels WHEELS=DIR [KIND=cuda]"; exit 2; }
	$(PYTHON) requirements/download_wheels.py $(KIND) $(WHEELS) \
		$(if $(PYTHON_VERSION),--python-version $(PYTHON_VERSION)) $(if $(PLATFORM),--platform $(PLATFORM))

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

# The quick benchmarks, each ratio against its floor for this machine class (configs/bench-floors.toml;
# tools/bench/check.py): minutes, not in CI. Run it on a quiet machine; exit 1 below a floor.
bench-check: setup
	$(BIN)/shardrec bench check

# Mutation testing of the core modules (scripts/mutants.py; slow, not part of `make test` or CI):
# prints each module's kill rate. MUTANTS="order files" runs only those; MUTANTS="--sample 4 format"
# tests one mutant in 4 of format.py.
mutants: setup
	$(BIN)/pip install -q -e '.[test,mutants]'
	$(BIN)/python scripts/mutants.py $(MUTANTS)

# The CUDA path in one call (README, "GPU check"): GPU tests + bench train on CUDA, one summary
# last; installs nothing unless GPU_CHECK_WHEELS names carried wheels. Without CUDA: one line, fails.
gpu-check:
	scripts/gpu_check.sh

clean:
	rm -rf $(VENV) runs *.egg-info
