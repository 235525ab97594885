"""scripts/gpu_run.sh's argument handling, which runs before anything is built: each mistake ends the script at
once with exit code 2 and says what was expected (a missing --out value used to loop forever)."""

import os
import subprocess
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu_run.sh")


class GpuRunArguments(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=30)

    def test_bad_arguments_exit_2_at_once(self):
        for args, expected in ((["--out"], "--out needs a folder"), (["--out", ""], "--out needs a folder"),
                               (["--out="], "--out DIR is required"), ([], "--out DIR is required"),
                               (["--bogus"], "unknown argument '--bogus'")):
            with self.subTest(args=args):
                r = self.run_script(*args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(f"gpu_run.sh: {expected}", r.stderr)

    def test_help_prints_the_usage(self):
        r = self.run_script("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("scripts/gpu_run.sh --out DIR [--bench-only] [--skip-build]", r.stdout)


if __name__ == "__main__":
    unittest.main()
