# commprof developer targets. Everything installs itself into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.commprof-installed
BASE := $(VENV)/.commprof-base
DEMO_DIR ?= commprof-demo
PYTEST_ARGS ?= --durations=25

.PHONY: install demo lint docs test bench golden clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# What `make demo` needs: torch, torchvision and commprof itself.
$(BASE): $(PY) setup.cfg pyproject.toml requirements-torch.txt
	$(PIP) install -q -r requirements-torch.txt
	$(PIP) install -q -e .
	touch $(BASE)

# Everything the whole test suite needs (frameworks, DALI, notebooks, HTA).
$(STAMP): $(PY) setup.cfg pyproject.toml requirements-torch.txt requirements-test.txt .ci/build_horovod.sh
	$(PIP) install -q -r requirements-test.txt
	$(PIP) install -q --no-deps holistictraceanalysis==0.5.0
	PY=$(PY) bash .ci/build_horovod.sh
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Record the default workload (ResNet-18, DDP, 2 CPU ranks, gloo), print the
# report and write report files into $(DEMO_DIR)/report/.
demo: $(BASE)
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/commprof record -o $(DEMO_DIR) --nproc 2 -- $(PY) workloads/resnet.py
	$(VENV)/bin/commprof report $(DEMO_DIR) --out-dir $(DEMO_DIR)/report

# Lint (ruff: pyflakes and pycodestyle rules, 120 columns) and type-check
# (mypy: commprof/trace and analyzers); settings in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The documentation site (docs/, mkdocs.yml) into site/; the CLI reference regenerated first.
docs: $(STAMP)
	$(PY) docs/tools/gen_cli.py
	$(PY) docs/tools/gen_benchmarks.py
	$(PY) docs/tools/gen_architecture.py
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: $(STAMP) lint
	bash .ci/install_system.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TORCH_EXTENSIONS_DIR="$${TORCH_EXTENSIONS_DIR:-$$HOME/.cache/commprof/torch_extensions}" \
		$(PY) -m pytest $(PYTEST_ARGS)

# Regenerate the golden reports of tests/golden/ (review the diff like code).
golden: $(BASE)
	$(PY) tests/golden/make_golden.py

bench: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/overhead.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache build site *.egg-info
