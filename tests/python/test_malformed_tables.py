"""Run files of the right schema version whose tables are malformed (ragged columns, a 2-D column, a metric column of
strings, a column the `columns` attribute names but the group lacks) and files whose schema_version is stored as a
string: reports/report.py, reports/compare.py and reports/bench_report.py say so on one line naming the file, the
table and the column, and exit 2 (compare: the bad file of the two, also when it is no HDF5 file at all); the reader
(reports/result_file.py read_table) raises TableError."""

import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
from reports import result_file  # noqa: E402

COMPARE_PY = os.path.join(ROOT, "reports", "compare.py")
REPORT_PY = os.path.join(ROOT, "reports", "report.py")
BENCH_REPORT_PY = os.path.join(ROOT, "reports", "bench_report.py")


def replace_column(path, table, column, data):
    """Replaces one column's dataset of a table in the file at `path` with `data` (a numpy array)."""
    with h5py.File(path, "r+") as f:
        g = f[table]
        del g[column]
        if data is not None:
            if data.dtype.kind == "U":
                g.create_dataset(column, data=data.astype(object), dtype=util.STR)
            else:
                g.create_dataset(column, data=data)


# (what, table, column, new data or None to remove it, words of the message)
DEFECTS = [
    ("ragged", "/bench/quant", "gbps", np.ones(3), "3 rows, but column 'case' has"),
    ("2-D", "/bench/quant", "time_us", np.ones((18, 2)), "shape (18, 2), expected a 1-D dataset"),
    ("metric of strings", "/bench/grouped_gemm", "tflops", np.array(["fast"] * 84), "strings, expected numbers"),
    ("ours of strings", "/repro/conversion_kernels", "ours", np.array(["1.5", "3"]), "strings, expected numbers"),
    ("absent", "/repro/conversion_kernels", "ratio", None, "absent, expected a 1-D dataset"),
]


class MalformedTables(util.Tmp):
    def setUp(self):
        super().setUp()
        self.good = self.path("good.h5")
        util.write_run(self.good, [1.5, 3.0])

    def bad_file(self, table, column, data):
        bad = self.path("bad.h5")
        util.write_run(bad, [1.5, 3.0])
        replace_column(bad, table, column, data)
        return bad

    def test_report_and_compare_name_file_table_and_column(self):
        for what, table, column, data, words in DEFECTS:
            with self.subTest(what=what):
                bad = self.bad_file(table, column, data)
                expected = f"'{bad}' table {table} column '{column}': {words}"
                with h5py.File(bad, "r") as f, self.assertRaises(result_file.TableError) as e:
                    result_file.read_table(f[table])
                self.assertIn(expected, str(e.exception))
                r = subprocess.run([sys.executable, REPORT_PY, bad, "--out", self.path("rep")], capture_output=True,
                                   text=True)
                self.assert_one_line(r, 2, "report", expected)
                self.assertFalse(os.path.exists(self.path("rep")))
                for args in ((self.good, bad), (bad, self.good)):
                    r = subprocess.run([sys.executable, COMPARE_PY, *args], capture_output=True, text=True)
                    self.assert_one_line(r, 2, "compare", expected)
                    self.assertNotIn(f"'{self.good}'", r.stderr)
                    self.assertEqual(r.stdout, "")
                if table.startswith("/bench/"):
                    r = subprocess.run([sys.executable, BENCH_REPORT_PY, bad], capture_output=True, text=True)
                    self.assert_one_line(r, 2, "bench_report", expected)

    def test_compare_names_the_file_that_is_not_hdf5(self):
        bad = self.path("notes.h5")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("not an HDF5 file\n")
        for args in ((self.good, bad), (bad, self.good)):
            r = subprocess.run([sys.executable, COMPARE_PY, *args], capture_output=True, text=True)
            self.assert_one_line(r, 2, "compare", f"'{bad}' is not a readable HDF5 file")

    def test_columns_attribute_of_another_shape(self):
        bad = self.path("bad.h5")
        util.write_run(bad, [1.5, 3.0])
        with h5py.File(bad, "r+") as f:
            f["/bench/quant"].attrs["columns"] = np.array([[1, 2], [3, 4]])
        r = subprocess.run([sys.executable, REPORT_PY, bad, "--out", self.path("rep")], capture_output=True,
                           text=True)
        self.assert_one_line(r, 2, "report", f"'{bad}' table /bench/quant: attribute `columns` is")

    def test_schema_version_of_another_type(self):
        for value, shown in (("1", "'1' stored as str"), (1.0, "1.0 stored as float")):
            with self.subTest(value=value):
                bad = self.path("bad.h5")
                util.write_run(bad, [1.5, 3.0])
                with h5py.File(bad, "r+") as f:
                    del f.attrs["schema_version"]
                    if isinstance(value, str):
                        f.attrs.create("schema_version", value, dtype=util.STR)
                    else:
                        f.attrs["schema_version"] = np.float64(value)
                for script, tool, args in ((REPORT_PY, "report", [bad]), (COMPARE_PY, "compare", [self.good, bad])):
                    r = subprocess.run([sys.executable, script, *args, "--out", self.path("o")], capture_output=True,
                                       text=True)
                    self.assertNotIn("Traceback", r.stderr)
                    self.assertIn(f"'{bad}' has schema_version {shown}, expected an int64 attribute", r.stderr)
                    self.assertNotEqual(r.returncode, 0)
                    self.assertFalse(os.path.exists(self.path("o")))


if __name__ == "__main__":
    unittest.main()
