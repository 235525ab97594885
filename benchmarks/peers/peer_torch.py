"""The torch side that the PyTorch peers attention_torch.py and group_linear_torch.py share: importing torch with a
Hopper GPU 0, and the timing loop."""

import statistics


def hopper_torch(unavailable, measures="Hopper (sm_90)"):
    """The torch module when it imports and sees a Hopper GPU 0; else raises unavailable(message), the peer's own
    exception for a machine that cannot run it, saying what is missing (measures: what the peer times, for the message
    about a GPU of another architecture)."""
    try:
        import torch
    except ImportError as e:
        raise unavailable(f"PyTorch is not installed ({e}); the peer needs torch with CUDA on a Hopper GPU") from None
    if not torch.cuda.is_available():
        raise unavailable(f"PyTorch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda}); "
                          f"the peer needs a Hopper GPU")
    major, minor = torch.cuda.get_device_capability(0)
    if major != 9:
        raise unavailable(f"GPU 0 is {torch.cuda.get_device_name(0)} (sm_{major}{minor}): the peer measures {measures}")
    return torch


def median_pass_seconds(torch, run, min_time_s, min_iters=5, max_iters=10000):
    """Median seconds of run() over CUDA events around each call, after one untimed warm-up call: at least min_iters
    calls and min_time_s seconds of timed calls, at most max_iters. torch: the imported module with a CUDA device."""
    run()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    while len(times) < max_iters and (len(times) < min_iters or sum(times) < min_time_s):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)
