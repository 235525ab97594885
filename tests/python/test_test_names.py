"""The names of the gtest tests stay readable in test output: a parameterised test is named after its parameter by
its suite's name generator (INSTANTIATE_TEST_SUITE_P's 4th argument: `.../N128_K576_balanced`), never by a bare
index (`.../0`), and its parameter prints short (a PrintTo beside a parameter struct), never as GoogleTest's byte
dump (`40-byte object <...>`). Every test program of the build is listed with --gtest_list_tests (no device
needed): fp4moe_tests_cpu and the GPU families fp4moe_tests_gpu_<family>."""

import glob
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402

BARE_INDEX = re.compile(r"/[0-9]+$")


def unreadable_names(listing):
    """The problems in one program's --gtest_list_tests output, one string each ("Suite.Test: why")."""
    problems, suite = [], ""
    for line in listing.splitlines():
        if not line.strip():
            continue
        name, _, comment = line.strip().partition("  # ")
        if not line.startswith(" "):
            suite = name.rstrip(".")
            full, what = suite, "suite"
        else:
            full, what = f"{suite}.{name}", "test"
        if "-byte object" in comment:
            problems.append(f"{full}: its parameter prints as bytes ({comment.strip()}); give it a PrintTo")
        if BARE_INDEX.search(name.rstrip(".")):
            problems.append(f"{full}: the {what} is named by an index; give INSTANTIATE_TEST_SUITE_P a name generator")
    return problems


def gtest_programs(build):
    return sorted(p for p in [os.path.join(build, "tests", "fp4moe_tests_cpu"),
                              *glob.glob(os.path.join(build, "tests", "fp4moe_tests_gpu*"))]
                  if os.path.isfile(p) and os.access(p, os.X_OK))


class TestNames(unittest.TestCase):
    def test_the_checker_flags_byte_dumps_and_bare_indices(self):
        listing = ("Plain.\n  Works\n"
                   "Shapes/Gemm.\n  Matches/N128_K576_balanced  # GetParam() = (128, 576, 0)\n"
                   "  Matches/3  # GetParam() = (4096, 7168, 2)\n"
                   "Mixes/Model.\n  Trains/bf16  # GetParam() = 40-byte object <00-11 22-33>\n"
                   "Typed/0.  # TypeParam = int\n  Works\n")
        self.assertEqual(unreadable_names(listing), [
            "Shapes/Gemm.Matches/3: the test is named by an index; give INSTANTIATE_TEST_SUITE_P a name generator",
            "Mixes/Model.Trains/bf16: its parameter prints as bytes (GetParam() = 40-byte object <00-11 22-33>); "
            "give it a PrintTo",
            "Typed/0: the suite is named by an index; give INSTANTIATE_TEST_SUITE_P a name generator"])

    def test_every_test_program_names_its_parameters(self):
        build = os.path.dirname(binary())
        programs = gtest_programs(build)
        if not programs:
            self.skipTest(f"no test program built in {build}/tests")
        for prog in programs:
            with self.subTest(program=os.path.basename(prog)):
                r = subprocess.run([prog, "--gtest_list_tests"], capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(".\n", r.stdout)
                self.assertEqual(unreadable_names(r.stdout), [])


if __name__ == "__main__":
    unittest.main()
