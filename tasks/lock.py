"""`pixi run lock`: re-solve pixi.lock and envs/.

Where pixi runs, this is `pixi lock` (pixi's own solver over the live channels) followed by the
exports; elsewhere it is the offline builder over the record store (envs/records/, tasks/lockgen/).
Extra arguments go to the builder (e.g. --refresh-pypi --wheel-dir DIR).
"""

import shutil
import subprocess
import sys

from lockgen.cli import main

if __name__ == "__main__":
    if shutil.which("pixi") and "--offline" not in sys.argv:
        subprocess.run(["pixi", "lock"], check=True)
        sys.exit(main(["--exports-only"]))
    sys.exit(main([a for a in sys.argv[1:] if a != "--offline"]))
