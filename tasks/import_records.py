"""Fill envs/records/ from public pixi.lock files: python tasks/import_records.py SOURCES_DIR

SOURCES_DIR holds PROVENANCE.tsv (blob, repository, commit, path) and <blob>.lock for each row: the
pixi.lock blobs as found in those repositories' git history. Only the records that the specs of
pixi.toml can reach are kept, each with the first source that carried it.
"""

import sys

from lockgen.cli import main

if __name__ == "__main__":
    sys.exit(main(["import-records", *sys.argv[1:]]))
