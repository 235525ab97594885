"""benchmarks/peers/peer_torch.py: median_pass_seconds, the timing loop of the PyTorch peers, against a stand-in for
torch's CUDA events (one untimed warm-up call, at least min_iters timed calls and min_time_s seconds, at most
max_iters, the median); hopper_torch's one-line refusal where torch is not installed."""

import importlib.util
import os
import sys
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))

import peer_torch  # noqa: E402


def torch_stand_in(durations_ms):
    """CUDA events whose start/stop pairs measure the given milliseconds in turn."""
    clock = {"t": 0.0, "i": 0}

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = clock["t"]

        def synchronize(self):
            pass

        def elapsed_time(self, stop):
            return stop.t - self.t

    def run():
        clock["t"] += durations_ms[clock["i"] % len(durations_ms)]
        clock["i"] += 1

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None))
    return torch, run, clock


class MedianPassSeconds(unittest.TestCase):
    def test_warm_up_then_at_least_min_iters(self):
        torch, run, clock = torch_stand_in([100.0, 1.0, 3.0, 2.0, 5.0, 4.0])  # the 100 ms call is the warm-up
        self.assertAlmostEqual(peer_torch.median_pass_seconds(torch, run, min_time_s=0.0, min_iters=5), 3e-3)
        self.assertEqual(clock["i"], 6)

    def test_runs_until_min_time_and_stops_at_max_iters(self):
        torch, run, clock = torch_stand_in([10.0])
        self.assertAlmostEqual(peer_torch.median_pass_seconds(torch, run, min_time_s=0.095, min_iters=1), 1e-2)
        self.assertEqual(clock["i"], 1 + 10)  # 10 timed calls of 10 ms reach 0.095 s
        torch, run, clock = torch_stand_in([10.0])
        peer_torch.median_pass_seconds(torch, run, min_time_s=100.0, min_iters=1, max_iters=7)
        self.assertEqual(clock["i"], 1 + 7)

    def test_median_of_an_even_count(self):
        torch, run, _ = torch_stand_in([0.0, 1.0, 2.0, 4.0, 8.0])
        self.assertAlmostEqual(peer_torch.median_pass_seconds(torch, run, min_time_s=0.0, min_iters=4), 3e-3)


class HopperTorch(unittest.TestCase):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed here")
    def test_refuses_without_torch(self):
        class Unavailable(Exception):
            pass
        with self.assertRaisesRegex(Unavailable, "^PyTorch is not installed .*; the peer needs torch with CUDA on a "
                                                 "Hopper GPU$"):
            peer_torch.hopper_torch(Unavailable)


if __name__ == "__main__":
    unittest.main()
