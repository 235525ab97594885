"""`fp4moe launch`: the rank environment every rank gets (shown by `fp4moe env`, and by a script run in place of
fp4moe through FP4MOE_LAUNCH_EXECUTABLE), the scheduler's ranks under Slurm and Open MPI, the failure behaviour (a
failing rank stops the others with one line naming it; SIGTERM, then SIGKILL; signals forwarded; no process
outlives the launcher), bad arguments (one line, exit 2), and `train`'s refusal of more than one rank. No GPU is
needed. The binary is $FP4MOE_BUILD/fp4moe."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from tests.python.cli_test_util import binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A stand-in for fp4moe, run by every rank: records its argv, environment, pid and process group in
# $LAUNCH_TEST_DIR/rank.<R>.json, writes a line to stdout and an unterminated one to stderr, then does what
# LAUNCH_TEST_ACTION_<R> says: exit<N> (after every rank recorded itself, so that the others run), sigkill (the
# same, then kills itself), sleep (120 s). SIGINT and SIGTERM are recorded in signal.<R> and end it with 128 + the
# number, except SIGTERM on the rank named by LAUNCH_TEST_IGNORE_TERM.
RANK_SCRIPT = r'''
import json, os, signal, sys, time
d = os.environ["LAUNCH_TEST_DIR"]
rank = os.environ.get("FP4MOE_RANK", "none")
world = int(os.environ.get("FP4MOE_WORLD_SIZE", "1"))

def on_signal(sig, frame):
    with open(os.path.join(d, f"signal.{rank}"), "w") as f:
        f.write(str(sig))
    os._exit(128 + sig)

signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("LAUNCH_TEST_IGNORE_TERM") == rank else on_signal)
info = {"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid(), "pgid": os.getpgid(0),
        "id_dir_exists": os.path.isdir(os.path.dirname(os.environ.get("FP4MOE_NCCL_ID_FILE", "/nonexistent/x")))}
with open(os.path.join(d, f"rank.{rank}.tmp"), "w") as f:
    json.dump(info, f)
os.rename(os.path.join(d, f"rank.{rank}.tmp"), os.path.join(d, f"rank.{rank}.json"))
sys.stdout.write(f"out of rank {rank}\n")
sys.stdout.flush()
sys.stderr.write(f"err of rank {rank}, unterminated")
sys.stderr.flush()
action = os.environ.get(f"LAUNCH_TEST_ACTION_{rank}", "exit0")

def wait_for_all():
    while not all(os.path.exists(os.path.join(d, f"rank.{r}.json")) for r in range(world)):
        time.sleep(0.01)

if action == "sleep":
    time.sleep(120)
elif action == "sigkill":
    wait_for_all()
    os.kill(os.getpid(), signal.SIGKILL)
else:
    if action != "exit0":
        wait_for_all()
    sys.exit(int(action[4:]))
'''


def gone(pid):
    """True when no process `pid` runs (none, or a zombie not reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


class LaunchCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.script = os.path.join(self.dir, "rank.py")
        with open(self.script, "w") as f:
            f.write(f"#!{sys.executable}\n{RANK_SCRIPT}")
        os.chmod(self.script, 0o755)
        self.launch_tmp = os.path.join(self.dir, "launch-tmp")  # $TMPDIR of the launcher: its fresh folders go here
        os.mkdir(self.launch_tmp)

    def tearDown(self):
        self.tmp.cleanup()

    def env(self, script=False, **extra):
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("FP4MOE_RANK", "FP4MOE_WORLD", "FP4MOE_LOCAL", "FP4MOE_NCCL", "FP4MOE_COMM",
                                  "SLURM_", "OMPI_", "LAUNCH_TEST_", "CUDA_VISIBLE_DEVICES"))}
        e["TMPDIR"] = self.launch_tmp
        e["LAUNCH_TEST_DIR"] = self.dir
        if script:
            e["FP4MOE_LAUNCH_EXECUTABLE"] = self.script
        e.update(extra)
        return e

    def launch(self, *args, expect_rc=0, env=None, timeout=60):
        cmd = [self.exe, "launch", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env=env if env is not None else self.env())
        self.assertEqual(r.returncode, expect_rc, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def rank_info(self, rank):
        with open(os.path.join(self.dir, f"rank.{rank}.json")) as f:
            return json.load(f)

    def wait_for_ranks(self, ranks, proc):
        deadline = time.time() + 30
        while not all(os.path.exists(os.path.join(self.dir, f"rank.{r}.json")) for r in ranks):
            self.assertIsNone(proc.poll(), "the launch ended before its ranks started")
            self.assertLess(time.time(), deadline, "the ranks did not start")
            time.sleep(0.02)

    def assert_gone(self, pids, within=10):
        deadline = time.time() + within
        while not all(gone(p) for p in pids):
            self.assertLess(time.time(), deadline, f"still running: {[p for p in pids if not gone(p)]}")
            time.sleep(0.05)

    def assert_launch_dirs_removed(self):
        self.assertEqual(os.listdir(self.launch_tmp), [])

    # --- the rank environment --------------------------------------------------------------------------------

    def test_env_shows_each_ranks_environment(self):
        out = self.launch("--gpus", "2", "--timeout-s", "17", "--", "env").stdout
        lines = out.splitlines()
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^\[rank [01]\] ")
        files = set()
        for r in (0, 1):
            ranked = [line for line in lines if line.startswith(f"[rank {r}] rank:")]
            self.assertEqual(len(ranked), 1, out)
            m = re.fullmatch(rf"\[rank {r}\] rank: +{r} of 2, local rank {r}, NCCL id file (\S+), timeout 17 s",
                             ranked[0])
            self.assertIsNotNone(m, ranked[0])
            files.add(m.group(1))
            self.assertTrue(any(line.startswith(f"[rank {r}] NCCL:") for line in lines), out)
        self.assertEqual(len(files), 1, files)  # one id file for all ranks
        path = files.pop()
        self.assertEqual(os.path.basename(path), "nccl-unique-id")
        self.assertEqual(os.path.dirname(os.path.dirname(path)), self.launch_tmp)
        self.assertRegex(os.path.basename(os.path.dirname(path)), r"^fp4moe-launch-")
        self.assert_launch_dirs_removed()

    def test_world_size_one_is_the_default(self):
        out = self.launch("--", "env").stdout
        self.assertNotIn("[rank", out)
        self.assertRegex(out, r"(?m)^rank: +0 of 1, local rank 0, NCCL id file \S+/nccl-unique-id, timeout 300 s$")
        self.assert_launch_dirs_removed()

    def test_env_without_launch_has_no_rank_environment(self):
        r = subprocess.run([self.exe, "env"], capture_output=True, text=True, timeout=60, env=self.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rank:         0 of 1 (no rank environment: not started by fp4moe launch)", r.stdout)

    def test_env_rejects_a_malformed_rank_environment(self):
        r = subprocess.run([self.exe, "env"], capture_output=True, text=True, timeout=60,
                           env=self.env(FP4MOE_RANK="1", FP4MOE_WORLD_SIZE="1", FP4MOE_LOCAL_RANK="0"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.strip().splitlines(),
                         ["fp4moe env: error: FP4MOE_RANK=1: expected a rank below FP4MOE_WORLD_SIZE=1"])
        self.assertEqual(r.stdout, "")

    def test_children_get_the_rank_variables_and_the_command(self):
        r = self.launch("--gpus", "3", "--", "train", "--config", "configs/tiny.toml", "--dry-run",
                        env=self.env(script=True))
        id_files = set()
        for rank in range(3):
            info = self.rank_info(rank)
            self.assertEqual(info["argv"], [self.script, "train", "--config", "configs/tiny.toml", "--dry-run"])
            env = info["env"]
            self.assertEqual(env["FP4MOE_RANK"], str(rank))
            self.assertEqual(env["FP4MOE_WORLD_SIZE"], "3")
            self.assertEqual(env["FP4MOE_LOCAL_RANK"], str(rank))
            self.assertEqual(env["FP4MOE_COMM_TIMEOUT_S"], "300")
            self.assertEqual(env["NCCL_NVLS_ENABLE"], "0")
            self.assertNotIn("CUDA_VISIBLE_DEVICES", env)  # every rank sees the node's GPUs, uses its local rank's
            self.assertTrue(info["id_dir_exists"])
            self.assertEqual(info["pgid"], info["pid"])  # a process group of its own
            id_files.add(env["FP4MOE_NCCL_ID_FILE"])
            self.assertIn(f"[rank {rank}] out of rank {rank}\n", r.stdout)
            self.assertIn(f"[rank {rank}] err of rank {rank}, unterminated\n", r.stderr)
        self.assertEqual(len(id_files), 1)
        self.assert_launch_dirs_removed()

    def test_users_cuda_visible_devices_passes_through(self):
        self.launch("--gpus", "2", "--", "env", env=self.env(script=True, CUDA_VISIBLE_DEVICES="4,5"))
        for rank in (0, 1):
            self.assertEqual(self.rank_info(rank)["env"]["CUDA_VISIBLE_DEVICES"], "4,5")

    def test_each_launch_has_a_fresh_id_folder(self):
        self.launch("--gpus", "2", "--", "env", env=self.env(script=True))
        first = self.rank_info(0)["env"]["FP4MOE_NCCL_ID_FILE"]
        self.launch("--gpus", "2", "--", "env", env=self.env(script=True))
        second = self.rank_info(0)["env"]["FP4MOE_NCCL_ID_FILE"]
        self.assertNotEqual(os.path.dirname(first), os.path.dirname(second))
        rendezvous = os.path.join(self.dir, "shared")
        os.mkdir(rendezvous)
        self.launch("--gpus", "2", "--rendezvous", rendezvous, "--", "env", env=self.env(script=True))
        third = self.rank_info(1)["env"]["FP4MOE_NCCL_ID_FILE"]
        self.assertEqual(os.path.dirname(os.path.dirname(third)), rendezvous)
        self.assertEqual(os.listdir(rendezvous), [])

    # --- schedulers ------------------------------------------------------------------------------------------

    def slurm(self, rank, ntasks, local, **extra):
        return self.env(script=True, SLURM_JOB_ID="77", SLURM_STEP_ID="3", SLURM_PROCID=str(rank),
                        SLURM_NTASKS=str(ntasks), SLURM_LOCALID=str(local), **extra)

    def test_slurm_task_is_one_rank(self):
        rendezvous = os.path.join(self.dir, "shared")
        os.mkdir(rendezvous)
        r = self.launch("--rendezvous", rendezvous, "--", "env", env=self.slurm(5, 8, 1))
        env = self.rank_info(5)["env"]
        self.assertEqual((env["FP4MOE_RANK"], env["FP4MOE_WORLD_SIZE"], env["FP4MOE_LOCAL_RANK"]), ("5", "8", "1"))
        self.assertEqual(env["FP4MOE_NCCL_ID_FILE"], os.path.join(rendezvous, "nccl-unique-id.slurm-77.3"))
        self.assertEqual(env["NCCL_NVLS_ENABLE"], "0")
        self.assertIn("out of rank 5\n", r.stdout)
        self.assertNotIn("[rank", r.stdout)  # one process: its output as it is
        self.assertEqual(os.listdir(self.launch_tmp), [])

    def test_open_mpi_process_is_one_rank(self):
        rendezvous = os.path.join(self.dir, "shared")
        os.mkdir(rendezvous)
        self.launch("--rendezvous", rendezvous, "--", "env",
                    env=self.env(script=True, OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4",
                                 OMPI_COMM_WORLD_LOCAL_RANK="0"))
        env = self.rank_info(2)["env"]
        self.assertEqual((env["FP4MOE_RANK"], env["FP4MOE_WORLD_SIZE"], env["FP4MOE_LOCAL_RANK"]), ("2", "4", "0"))
        self.assertEqual(env["FP4MOE_NCCL_ID_FILE"], os.path.join(rendezvous, "nccl-unique-id"))

    def test_slurm_batch_script_is_not_a_rank(self):
        env = self.slurm(0, 8, 0)
        del env["SLURM_STEP_ID"]
        self.launch("--gpus", "2", "--", "env", env=env)
        self.assertEqual(self.rank_info(1)["env"]["FP4MOE_WORLD_SIZE"], "2")

    def test_scheduler_arguments_are_checked(self):
        self.rejected("--gpus applies without a scheduler: under Slurm the ranks are its 8 tasks",
                      args=("--gpus", "2", "--", "env"), env=self.slurm(0, 8, 0))
        self.rejected("under Slurm with 8 ranks --rendezvous DIR is required",
                      args=("--", "env"), env=self.slurm(0, 8, 0))
        self.rejected("SLURM_LOCALID='x': expected a non-negative decimal integer",
                      args=("--", "env"), env=self.slurm(0, 8, "x"))
        self.rejected("--rendezvous /nonexistent/folder: not a folder",
                      args=("--rendezvous", "/nonexistent/folder", "--", "env"), env=self.slurm(0, 8, 0))

    # --- failure behaviour -----------------------------------------------------------------------------------

    def test_a_failing_rank_stops_the_others(self):
        start = time.time()
        r = self.launch("--gpus", "3", "--", "env", expect_rc=3,
                        env=self.env(script=True, LAUNCH_TEST_ACTION_0="sleep", LAUNCH_TEST_ACTION_1="exit3",
                                     LAUNCH_TEST_ACTION_2="sleep"))
        self.assertLess(time.time() - start, 30)
        self.assertEqual(r.stderr.splitlines()[-1],
                         "fp4moe launch: rank 1 of 3 exited with status 3; the other ranks were stopped (SIGTERM, "
                         "then SIGKILL after 10000 ms)")
        for rank in (0, 2):
            with open(os.path.join(self.dir, f"signal.{rank}")) as f:
                self.assertEqual(int(f.read()), signal.SIGTERM)
        self.assert_gone([self.rank_info(r)["pid"] for r in range(3)])
        self.assert_launch_dirs_removed()

    def test_a_rank_that_ignores_sigterm_gets_sigkill(self):
        start = time.time()
        r = self.launch("--gpus", "2", "--grace-s", "0.5", "--", "env", expect_rc=5,
                        env=self.env(script=True, LAUNCH_TEST_ACTION_0="sleep", LAUNCH_TEST_IGNORE_TERM="0",
                                     LAUNCH_TEST_ACTION_1="exit5"))
        self.assertGreaterEqual(time.time() - start, 0.5)
        self.assertLess(time.time() - start, 30)
        self.assertIn("rank 1 of 2 exited with status 5", r.stderr.splitlines()[-1])
        self.assertIn("SIGKILL after 500 ms", r.stderr.splitlines()[-1])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "signal.0")))
        self.assert_gone([self.rank_info(0)["pid"]])

    def test_a_rank_killed_by_a_signal_is_named(self):
        r = self.launch("--gpus", "2", "--", "env", expect_rc=128 + signal.SIGKILL,
                        env=self.env(script=True, LAUNCH_TEST_ACTION_0="sleep", LAUNCH_TEST_ACTION_1="sigkill"))
        self.assertRegex(r.stderr.splitlines()[-1],
                         r"^fp4moe launch: rank 1 of 2 was killed by signal 9 \(Killed\); the other ranks were stopped")

    def test_world_size_one_failure_is_named(self):
        r = self.launch("--", "env", expect_rc=4, env=self.env(script=True, LAUNCH_TEST_ACTION_0="exit4"))
        # One rank writes to the launcher's own stdout and stderr, unchanged (here an unterminated last line).
        self.assertEqual(r.stderr, "err of rank 0, unterminatedfp4moe launch: rank 0 of 1 exited with status 4\n")
        self.assertEqual(r.stdout, "out of rank 0\n")

    def test_sigint_and_sigterm_are_forwarded(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=sig.name):
                for name in os.listdir(self.dir):
                    if name.startswith(("rank.", "signal.")) and name != "rank.py":
                        os.remove(os.path.join(self.dir, name))
                proc = subprocess.Popen([self.exe, "launch", "--gpus", "2", "--", "env"], cwd=ROOT, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=self.env(script=True, LAUNCH_TEST_ACTION_0="sleep",
                                                     LAUNCH_TEST_ACTION_1="sleep"))
                try:
                    self.wait_for_ranks((0, 1), proc)
                    proc.send_signal(sig)
                    out, err = proc.communicate(timeout=30)
                finally:
                    proc.kill()
                self.assertEqual(proc.returncode, 128 + sig, err)
                self.assertEqual(err.splitlines()[-1], f"fp4moe launch: stopped by {sig.name}, forwarded to the ranks")
                for rank in (0, 1):
                    with open(os.path.join(self.dir, f"signal.{rank}")) as f:
                        self.assertEqual(int(f.read()), sig)
                self.assert_launch_dirs_removed()

    def test_no_rank_outlives_a_killed_launcher(self):
        proc = subprocess.Popen([self.exe, "launch", "--gpus", "2", "--", "env"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                env=self.env(script=True, LAUNCH_TEST_ACTION_0="sleep", LAUNCH_TEST_ACTION_1="sleep",
                                             LAUNCH_TEST_IGNORE_TERM="1"))
        try:
            self.wait_for_ranks((0, 1), proc)
            pids = [self.rank_info(r)["pid"] for r in (0, 1)]
            self.assertFalse(any(gone(p) for p in pids))
            proc.kill()
            proc.wait(timeout=10)
        finally:
            proc.kill()
        self.assert_gone(pids)

    # --- bad arguments ---------------------------------------------------------------------------------------

    def rejected(self, *parts, args=(), env=None):
        r = self.launch(*args, expect_rc=2, env=env)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("fp4moe launch: error: "), r.stderr)
        self.assertIsNone(re.search(r"\.cpp:\d+\)", lines[0]), lines[0])
        for p in parts:
            self.assertIn(p, lines[0])
        self.assertEqual(r.stdout, "")
        self.assertFalse(any(n.startswith("rank.") and n.endswith(".json") for n in os.listdir(self.dir)))
        self.assert_launch_dirs_removed()

    def test_bad_arguments_are_rejected(self):
        script = self.env(script=True)
        self.rejected("--gpus 0: expected the number of GPUs of this node to use, >= 1",
                      args=("--gpus", "0", "--", "env"), env=script)
        self.rejected("--gpus -2", args=("--gpus", "-2", "--", "env"), env=script)
        self.rejected("--gpus", args=("--gpus", "two", "--", "env"), env=script)
        self.rejected("unexpected argument '--dry-run': the subcommand's options go after --",
                      args=("--gpus", "2", "train", "--dry-run"), env=script)
        self.rejected("no subcommand to run", args=("--gpus", "2"), env=script)
        self.rejected("no subcommand to run", args=("--gpus", "2", "--"), env=script)
        self.rejected("launch cannot run under launch", args=("--gpus", "2", "--", "launch", "--", "env"), env=script)
        self.rejected("unknown subcommand 'trian' after --: expected one of env, quantize, bench, train",
                      args=("--", "trian"), env=self.env())
        self.rejected("--timeout-s 0: expected at least 1 second", args=("--timeout-s", "0", "--", "env"), env=script)
        self.rejected("--grace-s -1: expected a number of seconds in [0, 3600]", args=("--grace-s", "-1", "--", "env"),
                      env=script)
        self.rejected("--grace-s 1e+300: expected", args=("--grace-s", "1e300", "--", "env"), env=script)
        self.rejected("--rendezvous /nonexistent/folder: not a folder",
                      args=("--rendezvous", "/nonexistent/folder", "--", "env"), env=script)
        self.rejected("FP4MOE_RANK is set: this process is a rank of a launch already",
                      args=("--", "env"), env=self.env(script=True, FP4MOE_RANK="0", FP4MOE_WORLD_SIZE="1",
                                                       FP4MOE_LOCAL_RANK="0"))
        # FP4MOE_LAUNCH_EXECUTABLE names another program: its arguments are its own.
        self.launch("--", "trian", env=script)
        self.assertEqual(self.rank_info(0)["argv"][1:], ["trian"])

    # --- train ------------------------------------------------------------------------------------------------

    def test_train_over_ranks_refuses_what_is_not_built(self):
        def rejected(message, *extra):
            r = self.launch("--gpus", "2", "--", "train", "--config", "configs/tiny.toml", "--synthetic-data", *extra,
                            expect_rc=2)
            self.assertRegex(r.stderr, r"(?m)^\[rank [01]\] fp4moe train: error: " + message)
            self.assertRegex(r.stderr.splitlines()[-1], r"^fp4moe launch: rank [01] of 2 exited with status 2; ")
        rejected(r"the \[parallel\] section \(tp 1 pp 1 dp 2 ep 2\) emulates one GPU of a layout on one GPU; a run "
                 r"over 2 real ranks", "--parallel.dp", "2", "--parallel.ep", "2")
        rejected(r"moe.routed_experts = 7 must split evenly over the 2 expert-parallel ranks$",
                 "--moe.routed_experts", "7")

    def test_train_reads_the_rank_environment(self):
        def train(**env):  # one step into this test's folder where a GPU is there
            return subprocess.run([self.exe, "train", "--config", "configs/tiny.toml", "--synthetic-data",
                                   "--train.steps", "1", "--train.warmup_steps", "0",
                                   "--out", os.path.join(self.dir, "run.h5")],
                                  capture_output=True, text=True, timeout=300, cwd=ROOT, env=self.env(**env))
        r = train(FP4MOE_RANK="0", FP4MOE_LOCAL_RANK="0")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertRegex(r.stderr, r"^fp4moe train: error: FP4MOE_WORLD_SIZE is not set \([^\n]*\)\n$")
        # World size 1 passes the rank check: training goes on to look for its GPU (none here) or trains.
        r = train(FP4MOE_RANK="0", FP4MOE_WORLD_SIZE="1", FP4MOE_LOCAL_RANK="0")
        self.assertNotIn("FP4MOE", r.stderr)
        self.assertNotIn("not built", r.stderr)
        # --dry-run does not read it.
        r = subprocess.run([self.exe, "train", "--config", "configs/tiny.toml", "--synthetic-data", "--dry-run"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT,
                           env=self.env(FP4MOE_RANK="1", FP4MOE_WORLD_SIZE="2", FP4MOE_LOCAL_RANK="1"))
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
