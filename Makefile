# commprof developer targets. Everything installs itself into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.commprof-installed
BASE := $(VENV)/.commprof-base
# C++ ops torch and DeepSpeed build on first use, kept per environment
# (another checkout's venv has other source paths and would rebuild them)
EXT := $(CURDIR)/$(VENV)/torch_extensions
OPS := $(VENV)/.commprof-ops
DEMO_DIR ?= commprof-demo
PYTEST_ARGS ?= --durations=25

.PHONY: install demo lint docs test test-loaded bench golden clean

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

# On a machine without a GPU DeepSpeed builds its CPU shared-memory op at
# every job's start until it is built (~20 s on 2 cores): built here, with
# the venv's ninja on PATH as the tests' jobs have it (another ninja keeps
# another build log: the jobs would build it again). Then commprof's own
# compiled parts, as `commprof record` and `commprof report` build them on
# first use (~35 s on 2 cores; kept in ~/.cache/commprof/native): the native
# DDP hooks and the analysis kernels. Where one cannot be built, commprof
# uses its Python path and says why; the install goes on. Last, commprof's
# bytecode, as pip writes it for an installed package (an environment with
# PYTHONDONTWRITEBYTECODE would compile every module at each command).
$(OPS): $(STAMP) commprof/record/_pghooks.cpp analyzers/_kernels.c
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TORCH_EXTENSIONS_DIR=$(EXT) $(PY) -c "from deepspeed.accelerator \
		import get_accelerator as g; b = g().create_op_builder('ShareMemCommBuilder'); b is None or b.load()"
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -c "from commprof.record import native; native.build()" \
		|| echo "commprof's native DDP hooks were not built: recorded jobs use the Python hooks"
	$(PY) -c "from commprof.analyzers import native; native.kernel(); print('analysis kernels:', native.status())"
	$(PY) -m compileall -q commprof analyzers
	touch $(OPS)

install: $(STAMP) $(OPS)

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

# The suite in two parts: the tests that need a quiet machine (marked
# serial in tests/conftest.py) alone, after the rest, which runs on
# TEST_WORKERS workers (a file per worker). MARK: a marker expression both
# parts keep (MARK='not slow'). A part with nothing selected (pytest's exit
# 5) is not a failure unless both are empty.
TEST_WORKERS ?= auto
MARK ?=
TEST_ENV = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TORCH_EXTENSIONS_DIR="$${TORCH_EXTENSIONS_DIR:-$(EXT)}"

test: $(STAMP) $(OPS) lint
	bash .ci/install_system.sh
	a=0; b=0; \
	$(TEST_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "$(if $(MARK),($(MARK)) and )not serial" \
		$(PYTEST_ARGS) || a=$$?; \
	$(TEST_ENV) $(PY) -m pytest -m "$(if $(MARK),($(MARK)) and )serial" $(PYTEST_ARGS) || b=$$?; \
	echo "make test: parts exited $$a (on $(TEST_WORKERS) workers) and $$b (serial)"; \
	{ [ $$a = 0 ] || [ $$a = 5 ]; } && { [ $$b = 0 ] || [ $$b = 5 ]; } && [ "$$a$$b" != 55 ]

# The suite RUNS times (default 3) in a row, each from a fresh clone of HEAD
# with its own environment, while one core is kept busy (.ci/test_loaded.sh).
RUNS ?= 3
test-loaded:
	RUNS=$(RUNS) bash .ci/test_loaded.sh

# Regenerate the golden reports of tests/golden/ (review the diff like code).
golden: $(BASE)
	$(PY) tests/golden/make_golden.py

bench: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/overhead.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache build site *.egg-info
