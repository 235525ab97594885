"""The result-file side that the PyTorch peers (attention_torch.py, group_linear_torch.py, moe_model_torch.py) share:
the root attributes of a new result file as this process sees the machine, and the atomic write of a peer's table
through reports/result_file.py. reports/result_file.py (and so h5py) is imported only when a file is written or
checked, so that the peers' --list and argument errors need neither."""

import datetime
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def result_file_module():
    """reports/result_file.py, imported from this checkout."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from reports import result_file
    return result_file


def command_output(argv):
    """The stripped standard output of argv run in the checkout, or "unknown" when it fails, prints nothing or takes
    more than 20 s."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=ROOT)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def root_attributes(torch, command):
    """Root attributes of a new result file, the names of results/run_info.h (reports/result_file.py ROOT_ATTRIBUTES),
    from what this process can see: the checkout's git commit, the UTC time, GPU 0 and the driver, torch's CUDA and
    NCCL versions ("unknown" where torch has no NCCL), the host, and `command` (the peer's command line). torch: the
    imported module with a CUDA device."""
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 (no NCCL in this build of torch)
        nccl = "unknown"
    return {"schema_version": result_file_module().SCHEMA_VERSION,
            "git_sha": command_output(["git", "rev-parse", "HEAD"]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gpu": torch.cuda.get_device_name(0),
            "driver": command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]),
            "cuda": str(torch.version.cuda), "cublaslt": "unknown (PyTorch's)", "nccl": nccl,
            "host": socket.gethostname(), "command": command}


def write_table(path, family, columns, rows, attributes, new_file_root):
    """Adds (or replaces) the table /bench/<family> in the result file `path`, or creates the file with the root
    attributes `new_file_root()`; atomically (reports/result_file.py replace_table). columns: [(name, kind)] in table
    order (kind "str", "f64" or "i64"); rows: dicts holding every column; attributes: the table's {name: value}."""
    result_file_module().replace_table(path, f"/bench/{family}",
                                       [(c, kind, [r[c] for r in rows]) for c, kind in columns], attributes,
                                       new_file_root)


def unwritable(path):
    """Why the result file `path` cannot be written ("" when it can); reports/result_file.py unwritable."""
    return result_file_module().unwritable(path)
