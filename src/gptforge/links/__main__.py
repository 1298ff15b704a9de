"""``python -m gptforge.links``: the same command as ``gptforge fix-links``, for activation scripts.

The CLI loads only the invoked command's module, so this start-up stays as light as fix-links
needs for the no-op check on environment activation. Same flags, output and exit codes.
"""

import sys

from gptforge.cli import main

if __name__ == "__main__":
    sys.exit(main(["fix-links", *sys.argv[1:]]))
