"""`python3 -m nofrag torch_trace IN OUT`: the package's command-line tools.

`snapshot` is kept as an alias of `torch_trace` (the converter's old name)."""

import sys

from . import torch_trace


def main():
    if len(sys.argv) >= 2 and sys.argv[1] in ("torch_trace", "snapshot"):
        return torch_trace.main(sys.argv[2:])
    print("usage: python3 -m nofrag torch_trace SNAPSHOT.pickle[.gz] OUT.trace[.gz] [--device N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
