"""The PyTorch peers write their tables through reports/result_file.py replace_table: attention_torch's table goes
to /bench/attention_torch of a new file with the given root, replaces itself in an existing file without touching
the rest, and a file of another schema is refused and left as it was. No torch needed."""

import os
import sys
import tempfile
import unittest

import h5py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))

import attention_torch  # noqa: E402
from reports import result_file  # noqa: E402


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


if __name__ == "__main__":
    unittest.main()
