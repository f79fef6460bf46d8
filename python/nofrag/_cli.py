"""The `nofrag` command of a pip install: runs the CLI binary that setup.py
ships inside the package (nofrag/_bin/nofrag)."""

import os
import sys


def binary():
    """Path of the bundled CLI (it may be missing in a source checkout)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "nofrag")


def main():
    exe = binary()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"nofrag: the command-line tool is not installed at {exe} (install the package with "
                         "pip, or build it: cmake -S . -B build && cmake --build build -> build/nofrag)\n")
        return 2
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
