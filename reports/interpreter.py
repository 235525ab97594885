"""The Python that runs the report and reproduction scripts: one that imports numpy, pandas, h5py and matplotlib.

An entry script (reports/report.py, reports/compare.py, reports/bench_report.py, repro/run.py) calls
require(tool, modules) before its first import of those packages. When this interpreter cannot import one of them,
require() re-runs the script with the first interpreter that can: $FP4MOE_PYTHON, then /usr/bin/python3 (where
scripts/setup.sh installs Debian's packages), each tried first with this environment and then without PYTHONPATH
(a stray PYTHONPATH can hide a working installation). The re-run carries REEXEC_ENV, so it never re-runs itself
again. Where no interpreter can, it prints one line naming the missing package, this interpreter and `make setup`,
and exits with EXIT_CODE.

Standard library only: it runs before anything else is importable.
"""

import importlib
import os
import subprocess
import sys

PACKAGES = ("numpy", "pandas", "h5py", "matplotlib")
CANDIDATES = ("/usr/bin/python3",)
REEXEC_ENV = "FP4MOE_REEXEC"
EXIT_CODE = 2


def missing(modules):
    """(module, reason) of the first of `modules` this interpreter cannot import, or None when all import."""
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # ImportError, or a broken installation raising something else while importing
            return m, " ".join(f"{type(e).__name__}: {e}".split())
    return None


def _imports(python, modules, env):
    """True when `python` imports every one of `modules` in the environment `env`."""
    try:
        r = subprocess.run([python, "-c", "import " + ", ".join(modules)], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _candidates(env):
    """Interpreters to try, in order: FP4MOE_PYTHON of `env`, then CANDIDATES; each once, existing and executable."""
    seen, out = set(), []
    for p in [env.get("FP4MOE_PYTHON", "")] + list(CANDIDATES):
        if p and p not in seen and os.path.isfile(p) and os.access(p, os.X_OK):
            seen.add(p)
            out.append(p)
    return out


def find(modules, env=None):
    """(interpreter, environment) that imports every one of `modules`, or None. Tries each candidate with `env`
    (default: this process's) and then with PYTHONPATH removed; skips this interpreter in an unchanged environment
    (it already failed there)."""
    env = dict(os.environ if env is None else env)
    stripped = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    variants = [env] + ([stripped] if stripped != env else [])
    me = os.path.abspath(sys.executable) if sys.executable else ""  # not realpath: a venv's python is a link
    for python in _candidates(env):
        for e in variants:
            if e is env and os.path.abspath(python) == me:
                continue
            if _imports(python, modules, e):
                return python, e
    return None


def require(tool, modules=PACKAGES, argv=None):
    """Returns when this interpreter imports every one of `modules`; otherwise replaces the process with the script
    (sys.argv, or `argv`) run by an interpreter that does (find), or prints "<tool>: ..." on one line and exits
    with EXIT_CODE when there is none or this process is already such a re-run (REEXEC_ENV set)."""
    gap = missing(modules)
    if gap is None:
        os.environ.pop(REEXEC_ENV, None)  # the marker guards one re-run, not the programs this one starts
        return
    module, why = gap
    argv = list(sys.argv if argv is None else argv)
    found = None if os.environ.get(REEXEC_ENV) else find(modules)
    if found is not None:
        python, env = found
        env[REEXEC_ENV] = sys.executable or "?"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(python, [python] + argv, env)
    after = (f" (a re-run: {os.environ[REEXEC_ENV]} lacked it first)" if os.environ.get(REEXEC_ENV)
             else f"; neither does {', '.join(_candidates(os.environ)) or '/usr/bin/python3 (absent)'}")
    print(f"{tool}: this Python ({sys.executable}) cannot import {module} ({why}){after}: run `make setup` "
          f"(installs {', '.join(PACKAGES)}) and run the script with an interpreter that has them, e.g. "
          f"`/usr/bin/python3 {argv[0] if argv else ''}`", file=sys.stderr)
    sys.exit(EXIT_CODE)
