"""`python -m perfgate ...`: the same program as the `perfgate` console script (perfgate.cli)."""
import sys

from perfgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
