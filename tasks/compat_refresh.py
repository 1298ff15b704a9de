"""Rebuild the compatibility engine's tables made from artifacts (tasks/compatgen/), offline from the recorded
inputs; --fetch and --measure record the inputs anew from PyPI first."""

import sys

from compatgen.refresh import main

if __name__ == "__main__":
    sys.exit(main())
