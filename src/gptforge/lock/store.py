"""The record store (envs/records/): the conda records the solver may use, each from a public lock.

    sources.tsv                       id, repository, commit, path of each public pixi.lock read
    records.tsv                       subdir, file name, sha256, source id, purls of each record
    <channel>/<subdir>/repodata.json  the records themselves, as a channel's repodata

Records are never written by hand: tasks/lockgen/records.py reads them out of public pixi.lock files
with rattler, keeps those the manifest's specs can reach, and writes the store.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import GptforgeError

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
        return {row["id"]: Source(**row) for row in _read_tsv(self.root / "sources.tsv")}

    def records(self) -> dict[str, StoredRecord]:
        """By URL, as the lock names them."""
        out = {}
        for row in _read_tsv(self.root / "records.tsv"):
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


def _read_tsv(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh, delimiter="\t"))
    except OSError as err:
        raise GptforgeError(f"{path}: cannot read the record store: {err}", "restore envs/records/ from git")
