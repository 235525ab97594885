"""No output path of a Python command may be one of its inputs (the same path, a symbolic link or a hard link to it)
or anything but a regular file (a folder, a device node, a fifo): reports/compare.py, reports/bench_report.py,
reports/report.py, repro/merge.py (repro/run.py's run file) and reports/result_file.py (the PyTorch peers' result
files) all go through reports/output_path.py and refuse with one line, the input untouched."""

import hashlib
import os
import stat
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
from reports import output_path, result_file  # noqa: E402
from repro import merge  # noqa: E402

COMPARE_PY = os.path.join(ROOT, "reports", "compare.py")
REPORT_PY = os.path.join(ROOT, "reports", "report.py")
BENCH_REPORT_PY = os.path.join(ROOT, "reports", "bench_report.py")


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class OutputPaths(util.Tmp):
    def setUp(self):
        super().setUp()
        self.a, self.b = self.path("a.h5"), self.path("b.h5")
        util.write_run(self.a, [1.5, 3.0])
        util.write_run(self.b, [1.8, 2.4])
        self.before = {p: digest(p) for p in (self.a, self.b)}

    def aliases(self, target):
        """(kind, path) of the same file under other names: itself, a symbolic link, a hard link, and the path
        spelled through '..'."""
        link, hard = self.path("link_to_input"), self.path("hard_link_to_input")
        os.symlink(target, link)
        os.link(target, hard)
        os.mkdir(self.path("sub"))
        return [("same path", target), ("symbolic link", link), ("hard link", hard),
                ("other spelling", os.path.join(self.tmp, "sub", "..", os.path.basename(target)))]

    def device(self):
        """A character device node of this test's own (a copy of /dev/null's numbers), or None where this user may
        not make one. Never the system's /dev/null: a writer with the defect under test would replace it."""
        path = self.path("null_device")
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.stat(os.devnull).st_rdev)
        except (PermissionError, OSError):
            return None
        return path

    def non_regular(self):
        """(kind, path, expected words) of outputs that exist and are not regular files."""
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        folder = self.path("folder")
        os.mkdir(folder)
        device = self.device()
        return ([("device", device, "is a character device")] if device else []) + [
            ("fifo", fifo, "is a fifo"), ("folder", folder, "is a folder")]

    def assert_inputs_untouched(self):
        for p, d in self.before.items():
            self.assertEqual(digest(p), d, p)
        self.assertFalse([n for n in os.listdir(self.tmp) if ".tmp-" in n])

    def run_py(self, *args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)

    def test_compare_refuses_an_input_as_out(self):
        for kind, out in self.aliases(self.a):
            for args in ((self.a, self.b), (self.b, self.a)):
                with self.subTest(kind=kind, args=args):
                    r = self.run_py(COMPARE_PY, *args, "--out", out)
                    self.assert_one_line(r, 2, "compare", f"refused --out: '{out}' is the input")
                    self.assertIn("would destroy the input", r.stderr)
                    self.assert_inputs_untouched()

    def test_compare_refuses_outputs_that_are_not_regular_files(self):
        for kind, out, words in self.non_regular():
            with self.subTest(kind=kind):
                r = self.run_py(COMPARE_PY, self.a, self.b, "--out", out)
                self.assert_one_line(r, 2, "compare", f"'{out}' {words}, expected the path of a regular file")
        self.assertTrue(os.path.isdir(self.path("folder")))
        self.assert_inputs_untouched()

    def test_compare_writes_through_a_link_to_a_regular_file(self):
        old = self.path("old.md")
        with open(old, "w", encoding="utf-8") as f:
            f.write("old")
        link = self.path("cmp_link.md")
        os.symlink(old, link)
        r = self.run_py(COMPARE_PY, self.a, self.b, "--out", link)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.islink(link))  # the link stays, its target holds the comparison
        with open(old, encoding="utf-8") as f:
            self.assertTrue(f.read().startswith("# Comparison"))
        self.assert_inputs_untouched()

    def test_a_link_to_nothing_and_an_empty_path_are_refused(self):
        target = self.path("made_by_the_write.md")
        link = self.path("dangling.md")
        os.symlink(target, link)
        for script, tool, args in ((COMPARE_PY, "compare", (self.a, self.b)), (BENCH_REPORT_PY, "bench_report",
                                                                               (self.a,))):
            with self.subTest(tool=tool):
                r = self.run_py(script, *args, "--out", link)
                self.assert_one_line(r, 2, tool, f"refused --out: '{link}' is a symbolic link to '{target}', which "
                                                 f"does not exist")
                self.assertFalse(os.path.lexists(target))
                r = self.run_py(script, *args, "--out", "")
                self.assert_one_line(r, 2, tool, "refused --out: the output path is empty")
                self.assertEqual(r.stdout, "")
        with self.assertRaises(output_path.OutputPathError):
            output_path.write_text(link, "text")
        self.assertFalse(os.path.lexists(target))
        self.assert_inputs_untouched()

    def test_bench_report_refuses_its_input_and_non_regular_outputs(self):
        for kind, out in self.aliases(self.a):
            with self.subTest(kind=kind):
                r = self.run_py(BENCH_REPORT_PY, self.a, "--out", out)
                self.assert_one_line(r, 2, "bench_report", f"refused --out: '{out}' is the input")
        for kind, out, words in self.non_regular():
            with self.subTest(kind=kind):
                r = self.run_py(BENCH_REPORT_PY, self.a, "--out", out)
                self.assert_one_line(r, 2, "bench_report", words)
        self.assert_inputs_untouched()

    def test_report_refuses_a_folder_or_file_that_is_the_run_file(self):
        r = self.run_py(REPORT_PY, self.a, "--out", self.a)
        self.assert_one_line(r, 2, "report", f"refused output: '{self.a}' is the input '{self.a}'")
        # A run file named like one of the report's files, in the folder the report goes to.
        folder = self.path("out")
        os.mkdir(folder)
        for name, how in (("TABLES.md", os.replace), ("quant_fraction_of_copy.png", os.symlink)):
            with self.subTest(name=name):
                run = os.path.join(folder, name)
                util.write_run(self.path("r.h5"), [1.5, 3.0])
                how(self.path("r.h5"), run)
                d = digest(run)
                r = self.run_py(REPORT_PY, run, "--out", folder)
                self.assert_one_line(r, 2, "report", f"'{run}' is the input")
                self.assertEqual(digest(run), d)
                self.assertEqual(sorted(os.listdir(folder)), sorted({"TABLES.md", name}))  # nothing else written
        r = self.run_py(REPORT_PY, self.a, "--out", self.path("r.h5"))
        self.assert_one_line(r, 2, "report", f"'{self.path('r.h5')}' exists and is not a folder")
        self.assert_inputs_untouched()

    def test_report_never_replaces_a_fifo_among_its_files(self):
        folder = self.path("out")
        os.mkdir(folder)
        os.mkfifo(os.path.join(folder, "TABLES.md"))
        r = self.run_py(REPORT_PY, self.a, "--out", folder)
        self.assert_one_line(r, 2, "report", "TABLES.md' is a fifo")
        self.assertEqual(os.listdir(folder), ["TABLES.md"])  # no plot moved in, no temporary folder left

    def test_merged_run_file_is_none_of_the_merged_files(self):
        bench = self.path("bench.h5")
        util.write_bench_file(bench, "quant", util.quant_table(3))
        d = digest(bench)
        for kind, out in self.aliases(bench):
            with self.subTest(kind=kind):
                with self.assertRaisesRegex(output_path.OutputPathError, "is the input"):
                    merge.merge_run(out, [bench], [])
                self.assertEqual(digest(bench), d)
        for kind, out, words in self.non_regular():
            with self.subTest(kind=kind), self.assertRaisesRegex(output_path.OutputPathError, words):
                merge.merge_run(out, [bench], [])
        self.assertFalse([n for n in os.listdir(self.tmp) if ".tmp-" in n])

    def test_peer_result_files_are_regular_files_and_not_inputs(self):
        columns = [("case", "str", ["x"]), ("time_us", "f64", [1.0])]
        root = {"schema_version": result_file.SCHEMA_VERSION}
        for kind, out, words in self.non_regular():
            with self.subTest(kind=kind):
                self.assertIn(words, result_file.unwritable(out))
                if kind != "folder":
                    with self.assertRaisesRegex(output_path.OutputPathError, words):
                        result_file.replace_table(out, "/bench/x_torch", columns, {}, lambda: root)
        config = self.path("config.toml")
        with open(config, "w", encoding="utf-8") as f:
            f.write("[model]\n")
        self.assertIn("is the input", result_file.unwritable(config, inputs=[config]))
        with self.assertRaisesRegex(output_path.OutputPathError, "is the input"):
            result_file.replace_table(config, "/bench/x_torch", columns, {}, lambda: root, inputs=[config])
        with open(config, encoding="utf-8") as f:
            self.assertEqual(f.read(), "[model]\n")
        self.assertEqual(result_file.unwritable(self.path("new.h5"), inputs=[config]), "")

    def test_atomic_keeps_the_old_file_when_the_writer_fails(self):
        out = self.path("table.md")
        output_path.write_text(out, "old")
        with self.assertRaises(ZeroDivisionError):
            with output_path.atomic(out) as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write("half")
                1 / 0
        with open(out, encoding="utf-8") as f:
            self.assertEqual(f.read(), "old")
        self.assertEqual(sorted(os.listdir(self.tmp)), ["a.h5", "b.h5", "table.md"])


if __name__ == "__main__":
    unittest.main()
