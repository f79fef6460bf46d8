"""`python3 -m nofrag torch_trace IN OUT` and `python3 -m nofrag doctor`: the
package's command-line tools.

`snapshot` is kept as an alias of `torch_trace` (the converter's old name).
-h / --help prints the usage on stdout and exits 0; no or an unknown command
prints it on stderr and exits 2."""

import sys

USAGE = ("usage: python3 -m nofrag torch_trace SNAPSHOT.pickle[.gz] OUT.trace[.gz] [--device N]\n"
         "       python3 -m nofrag doctor [--json] [--device N] [--build-adapter]")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("torch_trace", "snapshot"):
        from . import torch_trace
        return torch_trace.main(argv[1:])
    if argv and argv[0] == "doctor":
        from . import doctor
        return doctor.main(argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
