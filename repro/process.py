"""Running one program of the reproduction suite with its output in a log file and progress lines on the console.

run_logged(argv, log_path, label, budget_min, progress) starts argv (stdout and stderr into log_path, which opens
with "$ <command line>"), feeds every output line to `progress` (an object with feed(line) and text()), prints
"<label>: <progress.text()>, <elapsed> elapsed" every HEARTBEAT_S seconds and "<label>: past its budget of N
GPU-minutes, still running" once when it runs past budget_min, and returns (exit code, elapsed seconds); 127 when
the program cannot be started (the reason is written to the log and printed).
"""

import re
import shlex
import subprocess
import threading
import time

HEARTBEAT_S = 30


def fmt_elapsed(seconds):
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class CountLines:
    """Progress as the number of output lines matching a regular expression: "<n> <unit> done"."""

    def __init__(self, pattern, unit):
        self.rx, self.unit, self.n = re.compile(pattern), unit, 0

    def feed(self, line):
        if self.rx.search(line):
            self.n += 1

    def text(self):
        return f"{self.n} {self.unit} done"


class TrainSteps:
    """Progress of `fp4moe train` from its plain progress lines ("step   10/1000 | loss ...", the step right-aligned
    to the width of the total: trainer/train/progress.cpp): "step 10/1000"."""

    RX = re.compile(r"^step\s+(\d+)/(\d+)")

    def __init__(self):
        self.last = ""

    def feed(self, line):
        m = self.RX.match(line)
        if m:
            self.last = f"step {m.group(1)}/{m.group(2)}"

    def text(self):
        return self.last or "starting"


def run_logged(argv, log_path, label, budget_min, progress, cwd=None):
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        try:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                 bufsize=1, cwd=cwd)
        except OSError as e:
            log.write(f"cannot start: {e}\n")
            print(f"{label}: cannot start {argv[0]}: {e}", flush=True)
            return 127, 0.0

        def pump():
            for line in p.stdout:
                log.write(line)
                log.flush()
                progress.feed(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        last, warned = start, False
        while True:
            try:
                rc = p.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - last >= HEARTBEAT_S:
                print(f"{label}: {progress.text()}, {fmt_elapsed(now - start)} elapsed", flush=True)
                last = now
            if not warned and now - start > 60 * budget_min:
                print(f"{label}: past its budget of {budget_min:g} GPU-minutes, still running", flush=True)
                warned = True
        reader.join()
    return rc, time.monotonic() - start
