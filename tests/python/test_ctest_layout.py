"""How ctest runs the GPU tests (tests/CMakeLists.txt): one ctest test per GPU test program, gpu_<family> with label
`gpu`, never one per gtest test (a CUDA context and cuBLASLt set-up per process made the GPU suite take over 7
minutes on an H200). Without a device each program's run ends with the line its SKIP_REGULAR_EXPRESSION matches
(ctest: skipped); under FP4MOE_REQUIRE_GPU=1 it fails and that line is absent, so a program whose host-only tests
pass while its device tests fail is reported as failed, not skipped. The build folder is $FP4MOE_BUILD.
Where the test sources sit (tests/CMakeLists.txt): tests/<family>/, a file test_<x>_gpu.cpp or .cu a GPU test of the
program fp4moe_tests_gpu_<family>, any other test_<x>.cpp a CPU test; shared helpers in tests/common/."""

import json
import os
import re
import shutil
import subprocess
import sys
import unittest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_FAMILIES = {"formats", "quant", "gemm", "nn", "attention"}
OTHER_FAMILIES = {"trainer", "results"}  # trainer/ and cli/; results/
NOT_FAMILIES = {"common", "python"}
TEST_FILE = re.compile(r"^test_[a-z0-9_]+(_gpu\.(cpp|cu)|\.cpp)$")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402


def properties(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def gpu_families():
    """The folders tests/<family>/ that hold a GPU test (test_<x>_gpu.cpp or .cu)."""
    return {d for d in os.listdir(TESTS) if d not in NOT_FAMILIES and os.path.isdir(os.path.join(TESTS, d))
            and any(re.search(r"_gpu\.(cpp|cu)$", f) for f in os.listdir(os.path.join(TESTS, d)))}


class TestSourceLayout(unittest.TestCase):
    def test_tests_sit_by_family_and_are_named_by_where_they_run(self):
        folders = {d for d in os.listdir(TESTS) if os.path.isdir(os.path.join(TESTS, d)) and d != "__pycache__"}
        self.assertEqual(folders - KERNEL_FAMILIES - OTHER_FAMILIES - NOT_FAMILIES, set(),
                         "a test folder that is no family (kernels/<family>, trainer, results) nor common/python")
        for d in sorted(folders - NOT_FAMILIES):
            for f in sorted(os.listdir(os.path.join(TESTS, d))):
                with self.subTest(file=f"tests/{d}/{f}"):
                    self.assertRegex(f, TEST_FILE)
        common = os.listdir(os.path.join(TESTS, "common"))
        self.assertFalse([f for f in common if f.startswith("test_")], "tests/common/ holds helpers, not tests")
        self.assertTrue({"quant", "gemm", "nn", "attention", "trainer"} <= gpu_families(), gpu_families())


class GpuTestLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.build = os.path.dirname(binary())
        if not os.path.isfile(os.path.join(cls.build, "CTestTestfile.cmake")):
            raise unittest.SkipTest(f"no tests configured in {cls.build} (set FP4MOE_BUILD to the build folder)")
        if not shutil.which("ctest"):
            raise unittest.SkipTest("ctest is not on PATH")
        r = subprocess.run(["ctest", "--show-only=json-v1", "-L", "gpu"], cwd=cls.build, capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"ctest --show-only failed: {r.stderr}")
        cls.tests = json.loads(r.stdout)["tests"]

    def test_one_ctest_test_per_gpu_program(self):
        self.assertGreater(len(self.tests), 0, "no ctest test has the label gpu")
        programs = []
        for t in self.tests:
            with self.subTest(test=t["name"]):
                program = os.path.basename(t["command"][0])
                self.assertRegex(program, r"^fp4moe_tests_gpu_[a-z_]+$")
                self.assertEqual(t["name"], "gpu_" + program[len("fp4moe_tests_gpu_"):])
                self.assertFalse([a for a in t["command"][1:] if a.startswith("--gtest_filter")],
                                 "a GPU ctest test must run its whole program")
                props = properties(t)
                self.assertIn("gpu", props.get("LABELS", []))
                self.assertIn(program, " ".join(props.get("SKIP_REGULAR_EXPRESSION", [])))
                programs.append(program)
        self.assertEqual(len(programs), len(set(programs)), "a GPU program is run by more than one ctest test")

    def test_one_gpu_program_per_folder_with_gpu_tests(self):
        self.assertEqual(sorted(t["name"] for t in self.tests), sorted(f"gpu_{d}" for d in gpu_families()))

    def run_program(self, test, require_gpu):
        env = {k: v for k, v in os.environ.items() if k != "FP4MOE_REQUIRE_GPU"}
        if require_gpu:
            env["FP4MOE_REQUIRE_GPU"] = "1"
        return subprocess.run(test["command"], cwd=properties(test).get("WORKING_DIRECTORY", self.build), env=env,
                              capture_output=True, text=True, timeout=600)

    def test_without_a_device_skipped_and_failed_under_require_gpu(self):
        exe = binary()
        if not os.access(exe, os.X_OK):
            self.skipTest(f"{exe} is not built")
        env = subprocess.run([exe, "env"], capture_output=True, text=True, timeout=60).stdout
        if "no CUDA device" not in env:
            self.skipTest("a CUDA device is present: make test-gpu runs the GPU programs")
        for t in self.tests:
            if not os.access(t["command"][0], os.X_OK):
                self.skipTest(f"{t['command'][0]} is not built")
            skip = [re.compile(p) for p in properties(t)["SKIP_REGULAR_EXPRESSION"]]
            with self.subTest(test=t["name"]):
                r = self.run_program(t, require_gpu=False)
                self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
                self.assertTrue(any(p.search(r.stdout) for p in skip), r.stdout[-3000:])
                self.assertRegex(r.stdout, r"tests skipped: no (usable )?CUDA device")
                r = self.run_program(t, require_gpu=True)
                self.assertNotEqual(r.returncode, 0, r.stdout[-3000:])
                self.assertFalse(any(p.search(r.stdout) for p in skip), r.stdout[-3000:])
                self.assertIn("(FP4MOE_REQUIRE_GPU is set)", r.stdout)


if __name__ == "__main__":
    unittest.main()
