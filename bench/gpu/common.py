"""What bench/gpu/train.py (one GPU), dist.py (torchrun) and spill.py share:
the environment of a run per allocator, the settings that make losses
comparable bit for bit across allocators, the GiB format of the tables, and
the orchestrators' time budget with results saved after every run."""

import json
import os
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
