import sys

from labutils.bench.suite import main

if __name__ == "__main__":
    sys.exit(1 if any(r.figure == "FAILED" for r in main()) else 0)
