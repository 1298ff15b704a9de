"""`pixi run lock`: re-solve pixi.lock and envs/.

Where pixi runs, this is `pixi lock` (pixi's own solver over the live channels) followed by the
exports; elsewhere it is gptforge's offline builder over the record store (envs/records/). Extra
arguments go to `gptforge lock` (e.g. --refresh-pypi --wheel-dir DIR).
"""

import shutil
import subprocess
import sys

from gptforge.cli import main

if __name__ == "__main__":
    if shutil.which("pixi") and "--offline" not in sys.argv:
        subprocess.run(["pixi", "lock"], check=True)
        sys.exit(main(["lock", "--exports-only"]))
    sys.exit(main(["lock", *[a for a in sys.argv[1:] if a != "--offline"]]))
