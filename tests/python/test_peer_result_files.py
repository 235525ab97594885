"""The PyTorch peers write their tables through reports/result_file.py replace_table: attention_torch's table goes
to /bench/attention_torch of a new file with the given root, replaces itself in an existing file without touching
the rest, and a file of another schema is refused and left as it was. The root attributes of a new file
(peer_result_file.root_attributes, shared by the three peers) carry the names of results/run_info.h. No torch needed:
a stand-in object answers the few torch calls the root attributes make."""

import os
import re
import sys
import tempfile
import types
import unittest

import h5py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))

import attention_torch  # noqa: E402
import peer_result_file  # noqa: E402
from reports import result_file  # noqa: E402


def torch_stand_in(nccl=(2, 21, 5)):
    """The parts of the torch module that root_attributes reads; nccl None: torch without NCCL (version() raises)."""
    def nccl_version():
        if nccl is None:
            raise RuntimeError("no NCCL")
        return nccl
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_device_name=lambda i: f"Test GPU {i}",
                                   nccl=types.SimpleNamespace(version=nccl_version)),
        version=types.SimpleNamespace(cuda="12.8"))


def rows(n):
    out = []
    for i in range(n):
        r = {}
        for c, kind in attention_torch.COLUMNS:
            r[c] = f"v{i}" if kind == "str" else (i if kind == "i64" else float(i))
        out.append(r)
    return out


class PeerResultFiles(unittest.TestCase):
    def test_new_replace_and_other_schema(self):
        root = {"schema_version": result_file.SCHEMA_VERSION, "gpu": "test GPU"}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sub", "run.h5")
            self.assertEqual(result_file.unwritable(path), "")  # creates the folder
            self.assertIn("is a folder", result_file.unwritable(tmp))
            attention_torch.write_into(path, rows(2), {"torch_version": "x"}, lambda: root)
            with h5py.File(path, "r+") as f:
                self.assertEqual(len(f["bench/attention_torch/case"]), 2)
                self.assertEqual(result_file.text(f.attrs["gpu"]), "test GPU")
                f.create_group("bench/other")
            attention_torch.write_into(path, rows(3), {}, lambda: self.fail("the file exists: no new root"))
            with h5py.File(path, "r") as f:
                self.assertEqual(len(f["bench/attention_torch/case"]), 3)
                self.assertIn("other", f["bench"])
            other = os.path.join(tmp, "old.h5")
            with h5py.File(other, "w") as f:
                f.attrs["schema_version"] = 99
            with self.assertRaises(result_file.SchemaError):
                attention_torch.write_into(other, rows(1), {}, lambda: root)
            with h5py.File(other, "r") as f:
                self.assertNotIn("bench", f)
            self.assertEqual(sorted(os.listdir(tmp)), ["old.h5", "sub"])  # no temporary left behind


    def test_root_attributes_of_a_new_file(self):
        attrs = peer_result_file.root_attributes(torch_stand_in(), "peer --h5 x.h5")
        self.assertEqual(list(attrs), result_file.ROOT_ATTRIBUTES)
        self.assertEqual(attrs["schema_version"], result_file.SCHEMA_VERSION)
        self.assertEqual((attrs["gpu"], attrs["cuda"], attrs["nccl"]), ("Test GPU 0", "12.8", "2.21.5"))
        self.assertEqual(attrs["command"], "peer --h5 x.h5")
        self.assertRegex(attrs["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertTrue(re.fullmatch(r"[0-9a-f]{40}", attrs["git_sha"]) or attrs["git_sha"] == "unknown")
        self.assertEqual(peer_result_file.root_attributes(torch_stand_in(None), "c")["nccl"], "unknown")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.h5")
            attention_torch.write_into(path, rows(1), {}, lambda: attrs)
            with h5py.File(path, "r") as f:
                self.assertEqual(result_file.root_attributes(f), attrs)

    def test_moe_model_peer_writes_the_same_root(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location("moe_model_torch", os.path.join(ROOT, "benchmarks", "peers",
                                                                                      "moe_model_torch.py"))
        mm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mm)
        mm.torch = torch_stand_in()
        row = {c: (0 if kind == "i64" else 0.0 if kind == "f64" else "x") for c, kind in mm.COLUMNS}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.h5")
            mm.write_into(path, [row], {}, "moe_model_torch.py bench")
            with h5py.File(path, "r") as f:
                root = result_file.root_attributes(f)
                self.assertEqual(set(root), set(result_file.ROOT_ATTRIBUTES))
                self.assertEqual((root["gpu"], root["command"]), ("Test GPU 0", "moe_model_torch.py bench"))
                self.assertEqual(len(f[f"bench/{mm.FAMILY}/case"]), 1)


if __name__ == "__main__":
    unittest.main()
