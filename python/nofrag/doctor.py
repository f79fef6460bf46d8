"""`python3 -m nofrag doctor [--json] [--device N] [--build-adapter]`: will
nofrag work here, from Python's side too.

It runs the `nofrag doctor` command (the library on the host backend, the
driver, each GPU's pool written and read back, spill, IPC limits: see
tools/doctor.c) and adds what only Python can see: the library the package
loads and its layout check, torch (version, CUDA build) and its C++ adapter
(built for this torch or not, a compiler to build it; `--build-adapter`
builds it now), CuPy. Exit status as the command's: 0 nothing failed, 1 a
check failed, 2 usage error.
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys

from . import _cli, _lib

USAGE = "usage: python3 -m nofrag doctor [--json] [--device N] [--build-adapter]"
MIN_TORCH = (2, 11)  # the adapter's PyTorch (docs/pytorch.md)


def _check(name, status, detail, hint=""):
    return {"name": name, "status": status, "detail": detail, "hint": hint}


def _cli_path():
    """The `nofrag` command that goes with the loaded library, or None.
    NOFRAG_CLI, where set, is the only candidate: a wrong one is an error
    (as NOFRAG_LIB is), not a silent fall-back to another command."""
    return _cli_find()[0]


def _cli_find():
    """(path, None), or (None, a failed check saying why not)."""
    env = os.environ.get("NOFRAG_CLI", "")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env, None
        return None, _check("command", "fail", f"NOFRAG_CLI={env!r} is not an executable file",
                            "point NOFRAG_CLI at a built `nofrag` command, or unset it")
    cands = [_cli.binary()]
    try:  # a build tree: build/nofrag next to build/libnofrag.so
        cands.append(os.path.join(os.path.dirname(_lib.path()), "nofrag"))
    except OSError:
        pass
    cands.append(shutil.which("nofrag") or "")
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c, None
    return None, _check("command", "fail", "the `nofrag` command was not found (package _bin/, next to the "
                        "library, NOFRAG_CLI, PATH)", "pip install the package, or cmake --build build")


def _native(args):
    """The command's checks (a list), or one failed check saying why not."""
    exe, why = _cli_find()
    if not exe:
        return [why]
    try:
        r = subprocess.run([exe, "doctor", "--json"] + args, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [_check("command", "fail", f"{exe} doctor: {e}")]
    if r.returncode == 2:
        raise SystemExit(r.stderr.strip() or USAGE)
    try:
        return [_check("command", "ok", f"{exe} doctor")] + json.loads(r.stdout)["checks"]
    except (ValueError, KeyError) as e:
        return [_check("command", "fail", f"{exe} doctor --json: unreadable output ({e}): {r.stderr.strip()[:200]}")]


def _python_checks(build):
    out = []
    from . import __version__
    try:
        lib = _lib.load()
    except OSError as e:  # LibraryError
        out.append(_check("package", "fail", str(e)))
        return out
    # The package's ctypes mirror of nf_stats_t against the library it loaded
    # (a package and a library of different versions disagree here).
    fields = [(n, getattr(_lib.NfStats, n).offset) for n, _ in _lib.NfStats._fields_]
    fields += [(f"calls.{n}", _lib.NfStats.calls.offset + getattr(_lib.NfCalls, n).offset) for n, _ in _lib.NfCalls._fields_]
    wrong = [n for n, off in fields if lib.nf_stats_offset(n.encode()) != off]
    if wrong or lib.nf_stats_size() != ctypes.sizeof(_lib.NfStats):
        out.append(_check("package", "fail", f"nofrag {__version__} (python) and {_lib.path()} disagree on "
                          f"nf_stats_t ({lib.nf_stats_size()} B against {ctypes.sizeof(_lib.NfStats)}; fields "
                          f"{', '.join(wrong[:5]) or 'none'})", "use the library built with this package (NOFRAG_LIB)"))
    else:
        out.append(_check("package", "ok", f"nofrag {__version__} (python) loads {_lib.path()}; nf_stats_t "
                          f"agrees ({len(fields)} fields, {ctypes.sizeof(_lib.NfStats)} B)"))
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        out.append(_check("torch", "info", f"torch not importable ({e.__class__.__name__}); nofrag.torch unused"))
        if build:
            out.append(_check("adapter", "fail", "--build-adapter: cannot build the C++ adapter without torch",
                              "install a CUDA build of torch first"))
    else:
        ver = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit())
        cuda = getattr(torch.version, "cuda", None)
        if not cuda:
            out.append(_check("torch", "fail", f"torch {torch.__version__} is a CPU-only build",
                              "nofrag.torch needs a CUDA build of torch"))
        elif ver < MIN_TORCH:
            out.append(_check("torch", "warn", f"torch {torch.__version__}: the C++ adapter needs >= "
                              f"{MIN_TORCH[0]}.{MIN_TORCH[1]}; enable() falls back to the ctypes path",
                              "what the fallback lacks: docs/pytorch.md"))
        else:
            out.append(_check("torch", "ok", f"torch {torch.__version__}, CUDA {cuda}"))
        from . import torch_adapter
        path, why = torch_adapter.build_adapter() if build else torch_adapter.built()
        if path:
            out.append(_check("adapter", "ok", f"built for this torch: {path}"))
        else:
            cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
            hint = ("python3 -m nofrag doctor --build-adapter builds it now (else the first enable() does)"
                    if cxx and not build else "install a C++ compiler (g++) and CUDA headers")
            out.append(_check("adapter", "fail" if build or not cxx else "info",
                              f"{why}; compiler: {cxx or 'none found (CXX, c++, g++)'}", hint))
    try:
        import cupy
    except Exception:  # noqa: BLE001
        out.append(_check("cupy", "info", "CuPy not importable; nofrag.cupy unused"))
    else:
        out.append(_check("cupy", "ok", f"CuPy {cupy.__version__}: nofrag.cupy.enable() makes nofrag its allocator"))
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    build = "--build-adapter" in argv
    rest = [a for a in argv if a not in ("--json", "--build-adapter")]
    if "-h" in rest or "--help" in rest:
        print(USAGE + "\n" + __doc__.split("\n\n", 1)[1].strip())
        return 0
    if rest and not (len(rest) == 2 and rest[0] == "--device"):
        print(f"nofrag doctor: unexpected arguments {rest}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        checks = _python_checks(build) + _native(rest)
    except SystemExit as e:  # the command refused the arguments
        print(e, file=sys.stderr)
        return 2
    failed = sum(c["status"] == "fail" for c in checks)
    if as_json:
        print(json.dumps({"failed": failed, "checks": checks}))
    else:
        print("nofrag doctor (python)")
        for c in checks:
            print(f"  {c['status']:<4}  {c['name']:<14} {c['detail']}")
            if c["hint"]:
                print(f"        {'':<14} -> {c['hint']}")
        print(f"{failed} check(s) failed." if failed else "Nothing failed.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
