"""`python3 -m nofrag snapshot IN OUT`: the package's command-line tools."""

import sys

from . import snapshot


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "snapshot":
        return snapshot.main(sys.argv[2:])
    print("usage: python3 -m nofrag snapshot SNAPSHOT.pickle[.gz] OUT.trace[.gz] [--device N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
