"""Shared by the tests of the fp4moe command line: where the binary under test is."""

import os


def binary():
    """$FP4MOE_BUILD/fp4moe (ctest sets FP4MOE_BUILD to the build folder), else build/fp4moe of this tree."""
    build = os.environ.get("FP4MOE_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    return os.path.join(build, "fp4moe")
