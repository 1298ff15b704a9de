"""The record store (envs/records/): the conda records the solver may use, each from a public lock.

    sources.tsv                       id, repository, commit, path of each public pixi.lock read
    records.tsv                       subdir, file name, sha256, source id, purls of each record
    <channel>/<subdir>/repodata.json  the records themselves, as a channel's repodata

Records are never written by hand: tasks/lockgen/records.py reads them out of public pixi.lock files
with rattler, keeps those the manifest's specs can reach, and writes the store.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.reading import read_text

SUBDIRS = ("linux-64", "noarch")
SOURCE_FIELDS = ("id", "repository", "commit", "path")
RECORD_FIELDS = ("subdir", "file_name", "sha256", "source", "purls")


@dataclass(frozen=True)
class Source:
    id: str
    repository: str
    commit: str
    path: str

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repository}/blob/{self.commit}/{self.path}"


@dataclass(frozen=True)
class StoredRecord:
    subdir: str
    file_name: str
    sha256: str
    source: str
    purls: tuple[str, ...] | None     # None: the source lock carried no purls for it


class Store:
    def __init__(self, root: Path, channel: str = "conda-forge"):
        self.root = Path(root)
        self.channel = channel

    def repodata_path(self, subdir: str) -> Path:
        return self.root / self.channel / subdir / "repodata.json"

    def sources(self) -> dict[str, Source]:
        return {row["id"]: Source(*(row[f] for f in SOURCE_FIELDS)) for row in _read_tsv(self.root / "sources.tsv", SOURCE_FIELDS)}

    def records(self) -> dict[str, StoredRecord]:
        """By URL, as the lock names them."""
        out = {}
        for row in _read_tsv(self.root / "records.tsv", RECORD_FIELDS):
            purls = None if row["purls"] == "-" else tuple(p for p in row["purls"].split(" ") if p)
            rec = StoredRecord(row["subdir"], row["file_name"], row["sha256"], row["source"], purls)
            out[f"https://conda.anaconda.org/{self.channel}/{rec.subdir}/{rec.file_name}"] = rec
        return out

    def check_readable(self) -> None:
        """Each recorded repodata.json parses as a channel's repodata (a damaged one is one line)."""
        from gptforge.lock.files import read_json

        self.check_exists()
        for subdir in SUBDIRS:
            data = read_json(self.repodata_path(subdir), "record store (restore envs/records/ from git)")
            if not isinstance(data, dict) or not all(isinstance(data.get(k, {}), dict) for k in ("packages", "packages.conda")):
                raise GptforgeError(f"{self.repodata_path(subdir)}: not a channel's repodata",
                                    "restore envs/records/ from git")

    def check_exists(self) -> None:
        for subdir in SUBDIRS:
            if not self.repodata_path(subdir).is_file():
                raise GptforgeError(f"{self.repodata_path(subdir)}: record store missing",
                                    "run tasks/import_records.py, or restore envs/records/ from git")


def _read_tsv(path: Path, fields: tuple[str, ...], fix: str = "restore envs/records/ from git") -> list[dict]:
    """The rows of a tab-separated table with a header naming at least FIELDS, each field a string (bounded
    reader: a FIFO or device is refused, a huge file is not loaded)."""
    try:
        rows = list(csv.DictReader(io.StringIO(read_text(path, fix=fix), newline=""), delimiter="\t"))
    except csv.Error as err:  # a field over csv's size limit
        raise GptforgeError(f"{path}: not a table ({err})", fix) from None
    bad = next((n for n, row in enumerate(rows, 1) if not all(isinstance(row.get(f), str) for f in fields)), None)
    if bad is not None:
        raise GptforgeError(f"{path} row {bad}: not the {len(fields)} fields {', '.join(fields)}", fix)
    return rows
