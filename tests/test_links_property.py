"""Property tests: fix-links on generated prefixes (real gcc-built libraries, dummy files,
dangling / cyclic / wrong links, lib64 in every shape, header conflicts, read-only parts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from gptforge import links
from gptforge.links.families import families_for
from conftest import (dangling, examples, gptforge_executable, install_library, regular_files, snapshot, symlink,
                      without_state, write)

CUDAS = [(12, 4), (12, 8), (13, 0)]
POOL = {
    "libcudart": [(12, 4, 127), (12, 4, 99), (12, 8, 90), (13, 0, 96)],
    "libcublas": [(12, 4, 5, 8), (12, 8, 4, 1), (13, 0, 0, 19), (13, 1, 1, 3)],
    "libcusparse": [(12, 3, 1, 170), (12, 5, 8, 93), (12, 6, 3, 3)],
    "libcudnn": [(8, 9, 7, 29), (9, 1, 0, 70), (9, 10, 2, 21)],
}
LINK_STATES = ["absent", "to-version", "dangling", "cycle", "file"]
LIB64_STATES = ["absent", "dir", "file", "link-lib", "wrong-link", "dangling"]
INCLUDE_STATES = ["absent", "dir", "dir-with-conflict", "dir-with-dangling"]


@st.composite
def prefixes(draw):
    families = {}
    for stem, versions in POOL.items():
        chosen = draw(st.lists(st.sampled_from(versions), unique=True, max_size=3))
        files = [(v, draw(st.sampled_from(["target", "lib"])), draw(st.sampled_from(["elf", "elf", "dummy", "mislabeled"])))
                 for v in chosen]
        majors = sorted({v[0] for v in versions})
        names = {f"{stem}.so": draw(st.sampled_from(LINK_STATES))}
        for major in majors:
            names[f"{stem}.so.{major}"] = draw(st.sampled_from(LINK_STATES))
        pointers = {name: draw(st.sampled_from(versions)) for name in names}
        families[stem] = (files, names, pointers)
    return {
        "cuda": draw(st.sampled_from(CUDAS)),
        "families": families,
        "lib64": draw(st.sampled_from(LIB64_STATES)),
        "include": draw(st.sampled_from(INCLUDE_STATES)),
        "headers": draw(st.booleans()),
        "cuda_record": draw(st.booleans()),
    }


def build(spec: dict, prefix: str) -> None:
    os.makedirs(os.path.join(prefix, "lib"))
    for stem, (files, names, pointers) in spec["families"].items():
        for version, place, kind in files:
            if kind == "dummy":
                write(os.path.join(prefix, "lib" if place == "lib" else "targets/x86_64-linux/lib",
                                   f"{stem}.so.{'.'.join(map(str, version))}"))
            else:
                install_library(prefix, stem, version, place=place,
                                soname_major=version[0] + 1 if kind == "mislabeled" else None)
        for name, state in names.items():
            path = os.path.join(prefix, "lib", name)
            target = f"{stem}.so.{'.'.join(map(str, pointers[name]))}"
            if state == "to-version":
                symlink(target, path)
            elif state == "dangling":
                symlink(f"{target}.gone", path)
            elif state == "cycle":
                symlink(f"{name}.loop", path)
                symlink(name, path + ".loop")
            elif state == "file":
                write(path, b"a stray regular file\n")
    _lib64(spec["lib64"], prefix)
    if spec["headers"]:
        write(os.path.join(prefix, "targets/x86_64-linux/include/cuda_runtime.h"), b"/* cuda_runtime */\n")
        write(os.path.join(prefix, "targets/x86_64-linux/include/crt/host_config.h"), b"/* crt */\n")
    _include(spec["include"], prefix)
    if spec["cuda_record"]:
        write(os.path.join(prefix, "conda-meta", f"cuda-version-{spec['cuda'][0]}.{spec['cuda'][1]}-0.json"),
              json.dumps({"name": "cuda-version", "version": f"{spec['cuda'][0]}.{spec['cuda'][1]}"}).encode())


def _lib64(state: str, prefix: str) -> None:
    path = os.path.join(prefix, "lib64")
    if state == "dir":
        write(os.path.join(path, "libother.so"), b"real lib64 content\n")
    elif state == "file":
        write(path, b"lib64 as a file\n")
    elif state == "link-lib":
        os.symlink("lib", path)
    elif state == "wrong-link":
        os.symlink("targets", path) if os.path.isdir(os.path.join(prefix, "targets")) else os.symlink("conda-meta", path)
    elif state == "dangling":
        os.symlink("nowhere", path)


def _include(state: str, prefix: str) -> None:
    path = os.path.join(prefix, "include")
    if state == "absent":
        return
    os.makedirs(path, exist_ok=True)
    write(os.path.join(path, "Python.h"), b"/* another package's header */\n")
    if state == "dir-with-conflict":
        write(os.path.join(path, "cuda_runtime.h"), b"/* some other cuda_runtime.h */\n")
    elif state == "dir-with-dangling":
        os.symlink("../targets/x86_64-linux/include/gone", os.path.join(path, "crt"))


def expected_choice(spec: dict, stem: str):
    """Independent oracle: the version the family's links must resolve to, or None."""
    files, _, _ = spec["families"][stem]
    good = [v for v, _, kind in files if kind == "elf"]
    family = next(f for f in families_for(spec["cuda"]) if f.stem == stem)
    if family.rule == "newest-per-major":
        return max(good, default=None)
    if family.rule == "cuda-or-newer-minor":  # same major, minor not older; the exact release first
        cuda = spec["cuda"]
        usable = [v for v in good if v[0] == cuda[0] and v[:2] >= cuda[:2]]
        return max([v for v in usable if v[:2] == cuda[:2]] or usable, default=None)
    return max((v for v in good if family.matches(v, spec["cuda"])), default=None)


def check_invariants(spec: dict, prefix: str, before: dict, result) -> None:
    after = snapshot(prefix)
    # no regular file or directory changed, moved or deleted
    assert regular_files(without_state(after)) == regular_files(before)
    # no dangling link introduced; every new or changed link resolves inside the prefix
    assert dangling(prefix) - {rel for rel in dangling(prefix) if rel in before and before[rel] == after[rel]} == set()
    real_prefix = os.path.realpath(prefix)
    for rel, kind in after.items():
        if kind[0] == "link" and before.get(rel) != kind and not rel.startswith(".gptforge"):
            assert os.path.realpath(os.path.join(prefix, rel)).startswith(real_prefix + os.sep), rel
    codes = {f.code for f in result.findings}
    errors = [f for f in result.findings if f.severity.value == "error"]
    assert result.exit_code == (1 if errors else 0)
    if spec["lib64"] in ("file", "wrong-link", "dangling"):
        assert "links-lib64-conflict" in codes and result.exit_code == 1
    if spec["lib64"] == "absent":
        assert os.path.realpath(os.path.join(prefix, "lib64")) == os.path.realpath(os.path.join(prefix, "lib"))
    for stem in POOL:
        want = expected_choice(spec, stem)
        mentioned = any(stem + ":" in f.message for f in result.findings)
        if want is None:
            files = spec["families"][stem][0]
            if any(kind == "elf" for _, _, kind in files):
                assert "links-no-match" in codes and mentioned
            continue
        link = os.path.join(prefix, "lib", f"{stem}.so")
        resolved = os.path.basename(os.path.realpath(link))
        ok = resolved == f"{stem}.so.{'.'.join(map(str, want))}"
        soname_link = os.path.join(prefix, "lib", f"{stem}.so.{want[0]}")
        ok = ok and os.path.realpath(soname_link) == os.path.realpath(link)
        # the one reason a usable file is not reached: one of its names is a regular file (never replaced)
        blocked = any(f.code == "links-name-blocked" and f.message.startswith(stem + ":") for f in result.findings)
        assert ok or blocked, f"{stem}: resolves to {resolved}, wanted {want}, and no finding explains it"
    if spec["headers"] and spec["include"] != "dir-with-conflict":
        assert os.path.isfile(os.path.join(prefix, "include", "cuda_runtime.h"))
        assert os.path.isfile(os.path.join(prefix, "include", "crt", "host_config.h"))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=prefixes())
def test_fix_is_safe_idempotent_and_undoable(spec):
    prefix = tempfile.mkdtemp(prefix="gptforge-links-prop-")
    try:
        build(spec, prefix)
        before = snapshot(prefix)
        result = links.fix(prefix, spec["cuda"])
        event(f"exit {result.exit_code}, {'some' if result.steps else 'no'} changes")
        for f in result.findings:
            event(f"finding {f.code}")
        check_invariants(spec, prefix, before, result)
        again = links.fix(prefix, spec["cuda"])
        assert again.steps == [], "a second run must plan nothing"
        assert again.exit_code == result.exit_code
        links.undo(prefix)
        assert snapshot(prefix) == before, "--undo must restore every name exactly"
    finally:
        shutil.rmtree(prefix)


def _immutable_supported(probe_dir: str) -> bool:
    if shutil.which("chattr") is None:
        return False
    probe = os.path.join(probe_dir, "probe")
    os.mkdir(probe)
    try:
        if subprocess.run(["chattr", "+i", probe], capture_output=True).returncode != 0:
            return False
        try:
            os.symlink("x", os.path.join(probe, "y"))
            return False
        except OSError:
            return True
    finally:
        subprocess.run(["chattr", "-i", probe], capture_output=True)
        shutil.rmtree(probe)


def _freeze(path: str, root: bool) -> None:
    """Make a directory refuse new entries: chmod for a normal user; chmod does not stop root,
    so as root the directory is made immutable (chattr +i), which does."""
    if root:
        subprocess.run(["chattr", "+i", path], check=True)
    else:
        os.chmod(path, 0o555)


def _thaw(path: str, root: bool) -> None:
    if root:
        subprocess.run(["chattr", "-i", path], capture_output=True)
    else:
        os.chmod(path, 0o755)


@settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=prefixes(), frozen=st.sets(st.sampled_from(["", "lib", "include", "targets/x86_64-linux/lib"]), min_size=1))
def test_read_only_parts_are_reported_not_half_changed(spec, frozen):
    root = os.geteuid() == 0
    prefix = tempfile.mkdtemp(prefix="gptforge-links-ro-")
    if root and not _immutable_supported(prefix):
        shutil.rmtree(prefix)
        pytest.skip("running as root and chattr +i is unavailable: nothing here can make a directory read-only for root")
    frozen_dirs = []
    try:
        shutil.rmtree(prefix)
        build(spec, prefix)
        before = snapshot(prefix)
        planned = links.fix(prefix, spec["cuda"], dry_run=True)
        for rel in sorted(frozen, reverse=True):
            path = os.path.join(prefix, rel) if rel else prefix
            if os.path.isdir(path) and not os.path.islink(path):
                _freeze(path, root)
                frozen_dirs.append(path)
        cuda = f"{spec['cuda'][0]}.{spec['cuda'][1]}"
        out = subprocess.run([*gptforge_executable(), "fix-links", "--prefix", prefix, "--cuda", cuda, "--json"],
                             capture_output=True, text=True)
        assert out.returncode in (0, 1), out.stderr
        report = json.loads(out.stdout)
        codes = {f["code"] for f in report["findings"]}
        touched = {os.path.dirname(s.path) for s in planned.steps}
        if planned.steps and (touched & set(frozen_dirs) or prefix in frozen_dirs):
            assert "links-read-only" in codes, report
        event("read-only reported" if "links-read-only" in codes else "not read-only where it mattered")
        if "links-read-only" in codes:
            assert out.returncode == 1 and report["applied"] == 0
            assert snapshot(prefix) == before, "a read-only prefix must not be half-changed"
        else:
            assert regular_files(without_state(snapshot(prefix))) == regular_files(before)
    finally:
        for path in frozen_dirs:
            _thaw(path, root)
        shutil.rmtree(prefix, ignore_errors=True)
