"""``python -m gptforge.links``: the same command as ``gptforge fix-links``, for activation scripts.

It imports only what fix-links needs (not every gptforge command), so the no-op check on
environment activation stays fast. Same flags, output and exit codes.
"""

import argparse
import sys

from gptforge.cli import OneLineParser
from gptforge.cli.links import DESCRIPTION, add_arguments, run
from gptforge.errors import GptforgeError, UsageError


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m gptforge.links", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except GptforgeError as err:
        kind = "usage error" if isinstance(err, UsageError) else "error"
        sys.stderr.write(f"gptforge fix-links: {kind}: {err.one_line()}\n")
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
