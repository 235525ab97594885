"""Run files of the right schema version whose tables are malformed (ragged columns, a 2-D column, a metric column of
strings, a column the `columns` attribute names but the group lacks or names twice, a required or key column absent,
a key column of numbers, a key on two rows, strings or attributes that are not UTF-8, NaN in a count column, a table
group without `columns`, /train or /bench stored as a dataset) and files whose schema_version is stored as a string
or missing: reports/report.py, reports/compare.py and reports/bench_report.py say so on one line naming the file, the
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
        _replace(f, table, column, data)


def _replace(f, table, column, data):
    """replace_column in an open, writable file `f`."""
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


    def refused(self, mutate, expected, tools=("report", "compare", "bench_report")):
        """Writes bad.h5 (the good run, then `mutate(open h5py file)`) and checks that each of `tools` refuses it
        with one line holding `expected` (str.format'ed with bad=the file's path), exit code 2, no report folder and
        no comparison printed."""
        bad = self.path("bad.h5")
        util.write_run(bad, [1.5, 3.0])
        with h5py.File(bad, "r+") as f:
            mutate(f)
        expected = expected.format(bad=bad)
        runs = {"report": [(REPORT_PY, bad, "--out", self.path("rep"))],
                "compare": [(COMPARE_PY, self.good, bad), (COMPARE_PY, bad, self.good)],
                "bench_report": [(BENCH_REPORT_PY, bad)]}
        for tool in tools:
            for args in runs[tool]:
                with self.subTest(tool=tool, args=args[1:]):
                    r = subprocess.run([sys.executable, *args], capture_output=True, text=True)
                    self.assert_one_line(r, 2, tool, expected)
                    self.assertEqual(r.stdout, "")
                    self.assertFalse(os.path.exists(self.path("rep")))

    def test_duplicate_column_names(self):
        def mutate(f):
            f["/bench/quant"].attrs.create("columns", ["case", "shape", "recipe", "case", "time_us"], dtype=util.STR)
        self.refused(mutate, "'{bad}' table /bench/quant column 'case': named twice in the attribute `columns`")

    def test_string_column_that_is_not_utf8(self):
        def mutate(f):
            g = f["/bench/quant"]
            del g["shape"]
            g.create_dataset("shape", data=np.array([b"4096x7168"] * 3 + [b"\xff\xfe"] * 13, dtype=object),
                             dtype=util.STR)
        self.refused(mutate, "'{bad}' table /bench/quant column 'shape': row 3 is not valid UTF-8")

    def test_root_attribute_that_is_not_utf8(self):
        def mutate(f):
            f.attrs.create("gpu", np.array(b"NVIDIA \xff", dtype=object), dtype=util.STR)
        self.refused(mutate, "'{bad}' root attribute 'gpu': not valid UTF-8")

    def test_table_attribute_that_is_not_utf8(self):
        def mutate(f):
            f["/repro/conversion_kernels"].attrs.create("title", np.array(b"\xc3", dtype=object), dtype=util.STR)
        self.refused(mutate, "'{bad}' /repro/conversion_kernels attribute 'title': not valid UTF-8", ("report",
                                                                                                       "compare"))

    def test_train_stored_as_a_dataset(self):
        self.refused(lambda f: f.create_dataset("train", data=np.ones(3)),
                     "'{bad}' /train: a dataset, expected a group of tables", ("report", "compare"))

    def test_bench_stored_as_a_dataset(self):
        def mutate(f):
            del f["bench"]
            f.create_dataset("bench", data=np.ones(3))
        self.refused(mutate, "'{bad}' /bench: a dataset, expected a group of tables")

    def test_nan_in_a_count_column(self):
        def mutate(f):
            util.write_table(f, "/train/r1/steps", {"step": [1, 2], "tokens": [4096, 8192], "loss": [9.0, 8.5],
                                                    "skipped": [0.0, float("nan")]})
        self.refused(mutate, "'{bad}' table /train/r1/steps column 'skipped': row 1 is nan, expected whole numbers",
                     ("report", "compare"))

    def test_key_column_of_numbers(self):
        self.refused(lambda f: _replace(f, "/bench/quant", "case", np.arange(16)),
                     "'{bad}' table /bench/quant column 'case': dtype int64, expected UTF-8 strings")

    def test_missing_key_column(self):
        def mutate(f):
            g = f["/bench/quant"]
            del g["case"]
            g.attrs.create("columns", [c for c in g.attrs["columns"] if c != "case"], dtype=util.STR)
        self.refused(mutate, "'{bad}' table /bench/quant column 'case': absent, expected it in every table of this "
                             "kind", ("report", "compare"))

    def test_missing_repro_column(self):
        def mutate(f):
            g = f["/repro/conversion_kernels"]
            del g["ratio"]
            g.attrs.create("columns", [c for c in g.attrs["columns"] if c != "ratio"], dtype=util.STR)
        self.refused(mutate, "'{bad}' table /repro/conversion_kernels column 'ratio': absent, expected it in every "
                             "table of this kind", ("report", "compare"))

    def test_compare_refuses_a_key_on_two_rows(self):
        self.refused(lambda f: _replace(f, "/bench/quant", "shape", np.array(["4096x7168"] * 16)),
                     "'{bad}' table /bench/quant column 'case': key (case='bf16_to_mxfp4_row/floor_rne', "
                     "shape='4096x7168', recipe='mxfp4') appears more than once", ("compare",))

    def test_table_group_without_columns(self):
        self.refused(lambda f: f["/bench/quant"].attrs.__delitem__("columns"),
                     "'{bad}' table /bench/quant: a group without the attribute `columns`")

    def test_bench_report_checks_the_schema_version(self):
        for value, shown in (("1", "has schema_version '1' stored as str"), (2, "has schema_version 2;"),
                             (None, "has no schema_version root attribute")):
            with self.subTest(value=value):
                def mutate(f):
                    del f.attrs["schema_version"]
                    if isinstance(value, str):
                        f.attrs.create("schema_version", value, dtype=util.STR)
                    elif value is not None:
                        f.attrs["schema_version"] = np.int64(value)
                self.refused(mutate, "'{bad}' " + shown, ("bench_report",))


if __name__ == "__main__":
    unittest.main()
