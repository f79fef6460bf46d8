"""What bench/gpu/train.py (one GPU), dist.py (torchrun) and spill.py share:
the environment of a run per allocator, the settings that make losses
comparable bit for bit across allocators, the GiB format of the tables, and
the orchestrators' machinery: the time budget with results saved after every
run, launching a worker (its process group killed on timeout), reading its
JSON back with the status fixed up, the uncapped runs and the min-capacity
bisection loop."""

import json
import os
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
GiB = 1 << 30


def base_env(alloc):
    """os.environ for a run under `alloc`: deterministic cuBLAS, nofrag's
    package and library found in this checkout, no allocator configuration
    inherited from the caller (expandable segments set only for 'expandable')."""
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONHASHSEED"] = "0"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("NOFRAG_LIB", os.path.join(ROOT, "build", "libnofrag.so"))
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "NOFRAG_CONF"):
        env.pop(k, None)
    if alloc == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def deterministic(torch, seed):
    """Seeds and kernel choices under which the loss of every step is the same
    bit for bit whatever the allocator. cuDNN and flash attention backward use
    atomics (non-deterministic even under use_deterministic_algorithms with
    warn_only): attention goes through the math kernel."""
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# --dry-run: the fakes' numbers are round and obviously synthetic (live 10 /
# 20 / 30 GiB, needs 1.5 / 1.25 / 1.125 x, steps of 1 s), every result says
# "dry_run": true, and the Markdown opens with this banner, so that nothing a
# dry run writes can be taken for a measurement.
DRY_BANNER = ("> **DRY RUN — not measured.** Every number below was made up by the script's --dry-run fakes "
              "(no torch, no GPU) to test the orchestration.")


def dry_banner(R):
    """The banner lines to open a report with ([] for a real run)."""
    return [DRY_BANNER, ""] if R.get("dry_run") else []


def long_steps(seq_lens, first, n, long_seq=None):
    """Indices of the long (GPU-bound) steps of a dynamic-shape run: from step
    `first` up to `n`, those whose sequence is >= long_seq (default 0.7 x the
    longest). Short steps are CPU-bound and move by +-20% between runs for
    every allocator alike, so the long ones are where an allocator's cost
    shows. [] for fixed shapes."""
    if not seq_lens or max(seq_lens) == min(seq_lens):
        return []
    thr = 0.7 * max(seq_lens) if long_seq is None else long_seq
    return [i for i in range(first, min(n, len(seq_lens))) if seq_lens[i] >= thr]


def gib(x):
    """Bytes as GiB with 3 decimals for the tables ('' for none)."""
    return f"{x / GiB:.3f}" if isinstance(x, (int, float)) and x else ""


class BudgetedRunner:
    """Base of the orchestrators: a deadline `budget` seconds from now, and
    results.json / results.md (rendered by `markdown`) in `out`, rewritten by
    save() after every run so that a run cut short keeps what it measured."""

    def __init__(self, out, budget, results, markdown):
        self.deadline = time.time() + budget
        self.results, self._markdown, self._out = results, markdown, out
        os.makedirs(out, exist_ok=True)
        self.n = 0

    def left(self):
        return self.deadline - time.time()

    def save(self):
        with open(os.path.join(self._out, "results.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self._out, "results.md"), "w") as f:
            f.write(self._markdown(self.results))

    # ------------------------------------------------------------ one run

    def timeout_for(self, timeout, floor):
        """`timeout` cut to the budget left (5 s kept for saving); None when
        under `floor` seconds remain (the caller records 'skipped')."""
        t = min(timeout, self.left() - 5)
        return t if t >= floor else None

    def launch(self, cmd, env, logpath, timeout):
        """Run `cmd` in its own process group, output to `logpath`. Returns its
        exit status, or "timeout" after killing the whole group (a launcher's
        ranks or a worker's children go with it)."""
        with open(logpath, "w") as log:
            p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                 start_new_session=True)
            try:
                return p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        p.wait(timeout=10)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                return "timeout"

    @staticmethod
    def load_json(path, default):
        """The worker's JSON, or `default` when it wrote none (or half of one)."""
        try:
            with open(path) as f:
                return json.load(f)
        except Exception:
            return dict(default)

    @staticmethod
    def settle(res, rc, timeout, logpath, running, tail):
        """Status of a finished worker: a timeout, or a crash when its JSON still
        says it was mid-way (a status in `running`); on any failure the last
        `tail` characters of its log are kept."""
        if rc == "timeout":
            res["status"] = f"timeout ({timeout:.0f}s)"
        elif res.get("status") in running:
            res["status"] = f"crash (rc {rc})"
        return BudgetedRunner.keep_log_tail(res, logpath, tail)

    @staticmethod
    def keep_log_tail(res, logpath, tail):
        """On failure (status not "ok"), the last `tail` characters of the log."""
        if res.get("status") != "ok":
            try:
                with open(logpath) as f:
                    res["log_tail"] = f.read()[-tail:]
            except OSError:
                pass
        return res

    def report(self, tag, res):
        print(f"[{time.strftime('%T')}] {tag}: {res['status']} in {res['elapsed_s']}s "
              f"(budget left {self.left():.0f}s)", flush=True)

    # ------------------------------------------------------ orchestration

    def uncapped(self, models, allocs, steps_of, run):
        """One run per (model, allocator), no cap, saved after each."""
        for model in models:
            for alloc in allocs:
                self.results["runs"].append(run(model, alloc, steps_of(model)))
                self.save()


def bisect_caps(lo, hi, tol, max_probes, probe, first=0):
    """Smallest feasible cap between `lo` (infeasible) and `hi` (feasible), to
    `tol` bytes, at most `max_probes` probes. probe(cap) returns "ok", "oom",
    "stop" (no verdict: end here) or "skip" (budget: end here); the first
    probe goes to `first` when inside (lo, hi). Yields (cap, verdict, lo, hi)
    after each probe, bounds updated."""
    n = 0
    while hi - lo > tol and n < max_probes:
        cap = first if (n == 0 and lo < first < hi) else (lo + hi) // 2
        v = probe(cap)
        if v == "skip":
            return
        n += 1
        if v == "ok":
            hi = cap
        elif v == "oom":
            lo = cap
        yield cap, v, lo, hi
        if v == "stop":
            return
