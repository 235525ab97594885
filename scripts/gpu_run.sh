#!/usr/bin/env bash
# One run on any Hopper (H100/H200) machine: configure and build (Release, Ninja), print `fp4moe env`, run every
# test with the GPU required, run the benchmark programs, and print a summary. Every step runs even after an
# earlier one failed; the script exits non-zero if any step failed.
#
#   scripts/gpu_run.sh --out DIR [--bench-only] [--skip-build]
#
#   --out DIR      where logs and results go (created):
#                    env.txt            fp4moe env
#                    build.log          configure + build
#                    tests.log          ctest --output-on-failure, every test, FP4MOE_REQUIRE_GPU=1
#                    tests.xml          the same as JUnit XML, with every test's output (a GPU test program, one
#                                       per kernel family, is one ctest test gpu_<family>: its counts, failures)
#                    bench_<name>.log   each benchmark program's output
#                    bench_<name>.h5    its results (programs that take --h5; bench_quant does)
#   --bench-only   skip the tests
#   --skip-build   use the existing build folder as it is
# Environment: BUILD (build folder, default build), JOBS (build and ctest jobs, default nproc).
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

out="" bench_only=0 skip_build=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out)
      [[ $# -ge 2 && -n "$2" ]] || { echo "gpu_run.sh: --out needs a folder (--out DIR)" >&2; exit 2; }
      out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --bench-only) bench_only=1; shift ;;
    --skip-build) skip_build=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ -z "$out" ]]; then
  echo "gpu_run.sh: --out DIR is required" >&2
  usage >&2
  exit 2
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$out" || { echo "gpu_run.sh: cannot create $out" >&2; exit 2; }
out="$(cd "$out" && pwd)"

declare -a step_names=() step_status=()
record() {  # record NAME EXIT_CODE
  step_names+=("$1")
  if [[ "$2" -eq 0 ]]; then step_status+=("ok"); else step_status+=("FAILED (exit $2)"); fi
  echo "== $1: ${step_status[-1]}"
}
skip() {  # skip NAME REASON
  step_names+=("$1")
  step_status+=("skipped ($2)")
  echo "== $1: skipped ($2)"
}

# ---- build --------------------------------------------------------------------------------------------------
if [[ $skip_build -eq 1 ]]; then
  skip build "--skip-build"
else
  echo "== build: $build (Release, Ninja, $jobs jobs)"
  python="$(for p in python3 /usr/bin/python3; do $p -c 'import h5py, numpy' 2>/dev/null && { command -v $p; break; }; done)"
  {
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${python:+-DFP4MOE_PYTHON=$python} &&
      cmake --build "$build" -j "$jobs"
  } >"$out/build.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && tail -n 30 "$out/build.log"
  record build $rc
fi

# ---- environment --------------------------------------------------------------------------------------------
if [[ -x "$build/fp4moe" ]]; then
  "$build/fp4moe" env 2>&1 | tee "$out/env.txt"
  record env "${PIPESTATUS[0]}"
else
  echo "fp4moe not built: $build/fp4moe" | tee "$out/env.txt"
  record env 1
fi

# ---- tests --------------------------------------------------------------------------------------------------
if [[ $bench_only -eq 1 ]]; then
  skip tests "--bench-only"
elif [[ ! -f "$build/CTestTestfile.cmake" ]]; then
  echo "no tests configured in $build" | tee "$out/tests.log"
  record tests 1
else
  echo "== tests: FP4MOE_REQUIRE_GPU=1 ctest (log: $out/tests.log)"
  (cd "$build" && FP4MOE_REQUIRE_GPU=1 ctest --output-on-failure -j "$jobs" --test-output-size-passed 4194304 \
     --output-junit "$out/tests.xml") \
    >"$out/tests.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|^\s+[0-9]+ - " "$out/tests.log" | tail -n 40
  record tests $rc
fi

# ---- benchmarks ---------------------------------------------------------------------------------------------
shopt -s nullglob
programs=("$build"/benchmarks/bench_*)
if [[ ${#programs[@]} -eq 0 ]]; then
  echo "no benchmark programs in $build/benchmarks"
  record benchmarks 1
fi
for prog in "${programs[@]}"; do
  [[ -f "$prog" && -x "$prog" ]] || continue
  name="$(basename "$prog")"
  args=()
  # Programs that write a result file take --h5 PATH (the flag's name is compiled into them).
  if grep -aq -- "--h5" "$prog"; then args+=(--h5 "$out/$name.h5"); fi
  echo "== $name ${args[*]} (log: $out/$name.log)"
  "$prog" "${args[@]}" 2>&1 | tee "$out/$name.log"
  record "$name" "${PIPESTATUS[0]}"
done

# ---- summary ------------------------------------------------------------------------------------------------
echo
echo "== summary ($out)"
failed=0
for i in "${!step_names[@]}"; do
  printf '  %-28s %s\n' "${step_names[$i]}" "${step_status[$i]}"
  [[ "${step_status[$i]}" == FAILED* ]] && failed=1
done
echo "  files: $(cd "$out" && ls | tr '\n' ' ')"
if [[ $failed -ne 0 ]]; then
  echo "gpu_run.sh: some steps failed"
  exit 1
fi
echo "gpu_run.sh: all steps passed"
