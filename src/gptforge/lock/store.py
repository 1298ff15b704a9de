"""The record store (envs/records/): the conda records the solver may use, each from a public lock.

    sources.tsv                       id, repository, commit, path of each public pixi.lock read
    records.tsv                       subdir, file name, sha256, source id, purls of each record
    <channel>/<subdir>/repodata.json  the records themselves, as a channel's repodata

Records are never written by hand: `import_locks` reads them out of public pixi.lock files with
rattler, keeps those the manifest's specs can reach, and writes the store.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gptforge.errors import GptforgeError
from gptforge.lock.files import write_text

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


def _tsv(fields: tuple[str, ...], rows: Iterable[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


# --- import -----------------------------------------------------------------------------------


def _purls_by_url(lock_text: str) -> dict[str, tuple[str, ...]]:
    doc = yaml.safe_load(lock_text)
    return {pkg["conda"]: tuple(pkg["purls"]) for pkg in doc.get("packages", [])
            if "conda" in pkg and "purls" in pkg}


def read_lock(path: Path, source_id: str) -> dict[str, tuple[dict, StoredRecord]]:
    """Every linux-64/noarch conda-forge record of a public lock: url -> (repodata record, stored row)."""
    from rattler import LockFile

    purls = _purls_by_url(Path(path).read_text())
    out = {}
    lock = LockFile.from_path(path)
    for _, env in lock.environments():
        for platform in env.platforms():
            for rec in env.conda_repodata_records_for_platform(platform) or ():
                if rec.subdir not in SUBDIRS or "/conda-forge/" not in rec.url:
                    continue
                data = json.loads(rec.to_json())
                for key in ("url", "channel"):
                    data.pop(key, None)
                row = StoredRecord(rec.subdir, rec.file_name, data["sha256"], source_id, purls.get(rec.url))
                out[rec.url] = (data, row)
    return out


def reachable(records: dict[str, tuple[dict, StoredRecord]], roots: Iterable[str]) -> set[str]:
    """Package names the solver can reach from these spec names through any record's depends."""
    deps_of: dict[str, set[str]] = {}
    for data, _ in records.values():
        deps_of.setdefault(data["name"], set()).update(d.split(" ")[0] for d in data.get("depends", ()))
    seen, todo = set(), [r for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name.startswith("__"):
            continue
        seen.add(name)
        todo.extend(deps_of.get(name, ()))
    return seen


def merge(locks: Iterable[tuple[str, dict]]) -> dict[str, tuple[dict, StoredRecord]]:
    """Records of several locks; the first source of a URL is kept, a different sha256 is an error."""
    merged: dict[str, tuple[dict, StoredRecord]] = {}
    for _, records in locks:
        for url, (data, row) in records.items():
            if url not in merged:
                merged[url] = (data, row)
                continue
            first = merged[url][1]
            if first.sha256 != row.sha256:
                raise GptforgeError(f"{url}: sha256 {first.sha256} in {first.source}, {row.sha256} in {row.source}",
                                    "drop one of the two sources")
            if first.purls is None and row.purls is not None:
                merged[url] = (merged[url][0], StoredRecord(**{**first.__dict__, "purls": row.purls}))
    return merged


def write(store: Store, sources: list[Source], records: dict[str, tuple[dict, StoredRecord]]) -> None:
    used = {row.source for _, row in records.values()}
    write_text(store.root / "sources.tsv",
                      _tsv(SOURCE_FIELDS, (s.__dict__ for s in sources if s.id in used)))
    rows = sorted((row for _, row in records.values()), key=lambda r: (r.subdir, r.file_name))
    write_text(store.root / "records.tsv", _tsv(RECORD_FIELDS, (
        {**r.__dict__, "purls": "-" if r.purls is None else " ".join(r.purls)} for r in rows)))
    for subdir in SUBDIRS:
        repodata = {"info": {"subdir": subdir}, "packages": {}, "packages.conda": {}, "repodata_version": 1}
        for data, row in records.values():
            if row.subdir == subdir:
                key = "packages.conda" if row.file_name.endswith(".conda") else "packages"
                repodata[key][row.file_name] = data
        text = json.dumps(repodata, indent=1, sort_keys=True) + "\n"
        write_text(store.repodata_path(subdir), text)


def import_locks(store: Store, sources_dir: Path, roots: Iterable[str]) -> int:
    """Read PROVENANCE.tsv and its <blob>.lock files from sources_dir; write the store. Returns records kept."""
    rows = _read_tsv(Path(sources_dir) / "PROVENANCE.tsv")
    sources = [Source(row["blob"], row["repository"], row["commit"], row["path"]) for row in rows]
    locks = [(s.id, read_lock(Path(sources_dir) / f"{s.id}.lock", s.id)) for s in sources]
    merged = merge(locks)
    keep = reachable(merged, roots)
    kept = {url: rec for url, rec in merged.items() if rec[0]["name"] in keep}
    write(store, sources, kept)
    return len(kept)


MAPPING_FIELDS = ("conda_name", "pypi_names")


def write_mapping(store: Store, mapping: dict, source_url: str) -> None:
    """pixi's conda-forge -> PyPI name mapping (parselmouth's compressed mapping), for the stored names."""
    names = sorted({json.loads(store.repodata_path(s).read_text())[k][fn]["name"]
                    for s in SUBDIRS for k in ("packages", "packages.conda")
                    for fn in json.loads(store.repodata_path(s).read_text())[k]})
    rows = [{"conda_name": n, "pypi_names": " ".join(mapping[n]) if mapping.get(n) else "-"} for n in names]
    write_text(store.root / "pypi-mapping.tsv", f"# source: {source_url}\n" + _tsv(MAPPING_FIELDS, rows))


def pypi_names(store: Store) -> dict[str, tuple[str, ...]]:
    """conda name -> the PyPI distributions it installs (empty: not a Python distribution)."""
    with open(store.root / "pypi-mapping.tsv", newline="") as fh:
        rows = csv.DictReader((line for line in fh if not line.startswith("#")), delimiter="\t")
        return {r["conda_name"]: () if r["pypi_names"] == "-" else tuple(r["pypi_names"].split()) for r in rows}
