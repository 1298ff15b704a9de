"""Decide which links to create or replace; change nothing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gptforge.compat.findings import Finding, Severity
from gptforge.links import scan
from gptforge.links.families import Family, Version, families_for
from gptforge.links.layout import TMP_MARK, Layout

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


@dataclass(frozen=True)
class Step:
    """One change: make ``path`` a symlink with text ``target`` ("link"), or drop a stale temp link."""

    action: str  # "link" | "remove-tmp"
    path: str
    target: str | None
    before: scan.Entry
    reason: str

    def to_json(self, layout: Layout) -> dict:
        return {
            "action": self.action,
            "path": layout.rel(self.path),
            "target": self.target,
            "before": self.before.to_json(),
            "reason": self.reason,
        }


@dataclass
class Plan:
    layout: Layout
    cuda: Version
    steps: list[Step] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    chosen: dict[str, scan.Candidate] = field(default_factory=dict)  # family stem -> file its links use
    cuda_source: str | None = None  # where the CUDA release came from ("--cuda", a record, ...)

    def note(self, code: str, severity: Severity, message: str, fix: str = "") -> None:
        self.findings.append(Finding(code, severity, message, fix))


def make_plan(layout: Layout, cuda: Version, cuda_source: str | None = None) -> Plan:
    plan = Plan(layout, cuda, steps=stale_temp_steps(layout), cuda_source=cuda_source)
    _lib64(plan)
    _libraries(plan)
    _headers(plan)
    return plan


def link_text(path: str, real: str) -> str:
    """A relative link text, so that the prefix stays relocatable."""
    return os.path.relpath(real, os.path.dirname(path))


def stale_temp_steps(layout: Layout) -> list[Step]:
    """Remove the temporary links an interrupted run (fix or undo) left behind."""
    steps = []
    for directory in dict.fromkeys((layout.prefix, layout.lib, layout.target_lib, layout.include)):
        if not os.path.isdir(directory) or os.path.islink(directory):
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.startswith(TMP_MARK) and os.path.islink(path):
                steps.append(Step("remove-tmp", path, None, scan.entry(path), "left by an interrupted run"))
    return steps


def _lib64(plan: Plan) -> None:
    layout = plan.layout
    now = scan.entry(layout.lib64)
    if now.kind == "absent":
        plan.steps.append(Step("link", layout.lib64, "lib", now, "tools that use $CUDA_HOME/lib64 (DeepSpeed) need it"))
    elif now.kind == "dir":
        plan.note("links-lib64-dir", INFO, "lib64 is a real directory; left as it is")
    elif now.real != os.path.realpath(layout.lib):
        what = f"a link to {now.target!r}" if now.kind == "link" else f"a {now.kind}"
        plan.note(
            "links-lib64-conflict",
            ERROR,
            f"{layout.lib64} is {what}, not a link to lib; $CUDA_HOME/lib64 would not find the libraries",
            f"move it aside yourself (e.g. mv {layout.lib64} {layout.lib64}.old) and rerun gptforge fix-links",
        )


def _libraries(plan: Plan) -> None:
    families = families_for(plan.cuda)
    names = scan.library_names(plan.layout, {f.stem for f in families})
    found = {f.stem: scan.candidates(plan.layout, f, names[f.stem]) for f in families if f.stem in names}
    unread = [(f, u) for f in families if f.stem in found for u in found[f.stem][2]]
    for (family, _), item in zip(unread, scan.read_unread(unread)):
        good, ignored, _ = found[family.stem]
        (good if isinstance(item, scan.Candidate) else ignored).append(item)
    for family in families:
        if family.stem in found:
            _family(plan, family, *found[family.stem][:2])


def _family(plan: Plan, family: Family, found: list[scan.Candidate], ignored: list[scan.Ignored]) -> None:
    for item in ignored:
        plan.note("links-candidate-ignored", INFO, f"{family.stem}: {item.path} ignored: {item.reason}")
    if not found:
        plan.note("links-no-real-file", WARNING,
                  f"{family.stem}: names present but no usable real library file in the prefix; links left as they are",
                  "reinstall the package that provides it if something needs it")
        return
    wanted = _wanted(plan, family, found)
    for name, cand in wanted.items():
        _point(plan, family, name, cand, create=True, directory=plan.layout.lib)
        if os.path.isdir(plan.layout.target_lib):
            _point(plan, family, name, cand, create=False, directory=plan.layout.target_lib)


def _wanted(plan: Plan, family: Family, found: list[scan.Candidate]) -> dict[str, scan.Candidate]:
    """link name -> the real file it must resolve to."""
    newest = lambda cands: max(cands, key=lambda c: (c.version, c.real))  # noqa: E731
    if family.rule == "newest-per-major":
        wanted = {}
        for major in sorted({c.version[0] for c in found}):
            best = newest([c for c in found if c.version[0] == major])
            wanted[best.soname] = best
        top = newest(found)
        plan.chosen[family.stem] = top
        return {family.unversioned(): top, **wanted}
    verdicts = [(c, family.matches(c.version, plan.cuda)) for c in found]
    if any(v is None for _, v in verdicts):
        plan.note("links-rule-unknown", WARNING,
                  f"{family.stem}: gptforge has no version facts for it with CUDA {_v(plan.cuda)}; links left as they are",
                  _cuda_hint(plan, "if the environment's CUDA is another release"))
        return {}
    matching = [c for c, ok in verdicts if ok]
    if not matching:
        have = ", ".join(sorted(_v(c.version) for c in found))
        plan.note("links-no-match", ERROR,
                  f"{family.stem}: no real file for CUDA {_v(plan.cuda)} in the prefix (found {have})",
                  f"install the {family.stem} of CUDA {_v(plan.cuda)} (e.g. pin cuda-version={_v(plan.cuda)}), or "
                  + _cuda_hint(plan, "with the environment's CUDA"))
        return {}
    exact = [c for c in matching if c.version[:2] == plan.cuda[:2]]
    best = newest(exact or matching)
    plan.chosen[family.stem] = best
    return {family.unversioned(): best, best.soname: best}


def _point(plan: Plan, family: Family, name: str, cand: scan.Candidate, *, create: bool, directory: str) -> None:
    path = os.path.join(directory, name)
    now = scan.entry(path)
    if now.real == cand.real:
        return
    if now.kind == "absent" and not create:
        return
    if now.kind in ("absent", "link"):
        why = {"absent": "missing", "link": "dangling or cyclic" if now.real is None else "resolves to another file"}
        plan.steps.append(Step("link", path, link_text(path, cand.real), now,
                               f"{family.stem} {_v(cand.version)}: {why[now.kind]}"))
        return
    plan.note("links-name-blocked", ERROR,
              f"{family.stem}: {plan.layout.rel(path)} is a {now.kind}, not a link, and is not {os.path.basename(cand.real)}; "
              "fix-links never replaces files",
              f"remove or rename {path} yourself, then rerun gptforge fix-links")


def _headers(plan: Plan) -> None:
    layout = plan.layout
    if not os.path.isdir(layout.target_include):
        return
    top = scan.entry(layout.include)
    target_real = os.path.realpath(layout.target_include)
    if top.kind == "absent" or (top.kind == "link" and top.real is None):
        plan.steps.append(Step("link", layout.include, link_text(layout.include, layout.target_include), top,
                               "CUDA headers reachable from $CUDA_HOME/include"))
        return
    if top.real == target_real:
        return
    if top.kind != "dir" or not layout.inside(layout.include):
        plan.note("links-header-shadowed", WARNING,
                  f"{layout.include} is not a directory of the prefix; CUDA headers not linked into it")
        return
    try:
        names = sorted(os.listdir(layout.target_include))
    except OSError as err:
        plan.note("links-headers-unreadable", WARNING,
                  f"{layout.target_include} cannot be listed by this user ({err.strerror}); CUDA headers not linked",
                  "run fix-links as the prefix's owner, or make the directory readable (chmod a+rx)")
        return
    for name in names:
        _header(plan, name)


def _header(plan: Plan, name: str) -> None:
    layout = plan.layout
    path, source = os.path.join(layout.include, name), os.path.join(layout.target_include, name)
    now = scan.entry(path)
    if now.real == os.path.realpath(source) or name.startswith(TMP_MARK):
        return
    if now.kind == "absent" or (now.kind == "link" and now.real is None):
        plan.steps.append(Step("link", path, link_text(path, source), now, "CUDA header reachable from $CUDA_HOME/include"))
    elif not (now.kind == "file" and os.path.isfile(source) and _same_bytes(path, source)):
        plan.note("links-header-shadowed", WARNING,
                  f"include/{name} exists and is not the CUDA one; left as it is (nvcc still finds the CUDA one)")


def _same_bytes(a: str, b: str) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def _cuda_hint(plan: Plan, when: str) -> str:
    if plan.cuda_source == "--cuda":  # never suggest the flag that was already given
        return f"make sure --cuda {_v(plan.cuda)} is the environment's CUDA release"
    return f"pass --cuda X.Y {when}"


def _v(version: Version) -> str:
    return ".".join(map(str, version))
