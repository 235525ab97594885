# Sourced by the scripts that run the fp4moe binary and read its HDF5 files (train_fingerprint.sh,
# graph_step_time.sh): sets `root` (the repository), `build` (BUILD, default $root/build) and `python` (PYTHON, default
# the first of python3, /usr/bin/python3 that imports h5py), and exits 2 naming `script_name` when either is missing.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build}"
python="${PYTHON:-$(for p in python3 /usr/bin/python3; do $p -c 'import h5py' 2>/dev/null && { echo $p; break; }; done)}"
[[ -x "$build/fp4moe" ]] || { echo "$script_name: no fp4moe in $build (build first, or set BUILD)" >&2; exit 2; }
[[ -n "$python" ]] || { echo "$script_name: no python3 imports h5py (run scripts/setup.sh)" >&2; exit 2; }
