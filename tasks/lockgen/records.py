"""Filling the record store (envs/records/) from public pixi.lock files, and the conda-to-PyPI name
mapping the offline builder reads. The store's layout and its reader: gptforge.lock.store."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.lock.store import RECORD_FIELDS, SOURCE_FIELDS, SUBDIRS, Source, Store, StoredRecord, _read_tsv
from gptforge.reading import read_yaml
from lockgen.writer import write_text


def _tsv(fields: tuple[str, ...], rows: Iterable[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, delimiter="\t", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


# --- import -----------------------------------------------------------------------------------


SOURCE_FIX = "fetch it again, or drop it from PROVENANCE.tsv"


def _purls_by_url(path: Path) -> dict[str, tuple[str, ...]]:
    """The purls of each conda package, read through the bounded reader (a FIFO, a huge or deep file, a YAML
    tag or alias is one line)."""
    packages = read_yaml(path, expect=dict, fix=SOURCE_FIX).get("packages", [])
    if not isinstance(packages, list) or not all(isinstance(pkg, dict) for pkg in packages):
        raise GptforgeError(f"{path}: its packages are not a list of tables", SOURCE_FIX)
    return {pkg["conda"]: tuple(pkg["purls"]) for pkg in packages
            if isinstance(pkg.get("conda"), str) and isinstance(pkg.get("purls"), list)}


def read_lock(path: Path, source_id: str) -> dict[str, tuple[dict, StoredRecord]]:
    """Every linux-64/noarch conda-forge record of a public lock: url -> (repodata record, stored row)."""
    from rattler import LockFile

    purls = _purls_by_url(Path(path))
    out = {}
    try:
        lock = LockFile.from_path(path)
    except Exception as err:  # rattler's parse errors share no base class but Exception
        raise GptforgeError(f"{path}: not a lock rattler reads ({(str(err).splitlines() or [''])[0][:160]})",
                            SOURCE_FIX) from None
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


PROVENANCE_FIELDS = ("blob", "repository", "commit", "path")


def import_locks(store: Store, sources_dir: Path, roots: Iterable[str]) -> int:
    """Read PROVENANCE.tsv and its <blob>.lock files from sources_dir; write the store. Returns records kept."""
    rows = _read_tsv(Path(sources_dir) / "PROVENANCE.tsv", PROVENANCE_FIELDS,
                     "write one row per lock: " + ", ".join(PROVENANCE_FIELDS))
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
