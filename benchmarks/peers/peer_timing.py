"""The timing loop that the PyTorch peers attention_torch.py and group_linear_torch.py share."""

import statistics


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
