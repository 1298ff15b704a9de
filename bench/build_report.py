"""Summarise a bench/build_apex_device.sh run: a table on stdout and results.json in the same directory.

    python bench/build_report.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(out: Path, name: str) -> dict | None:
    path = out / name
    if not path.is_file() or not path.read_text().strip():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {"unparsed": path.read_text()[-2000:]}


def tail(out: Path, name: str, lines: int = 25) -> list[str]:
    path = out / name
    return path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []


def figures(out: Path) -> dict:
    data = {}
    env = out / "figures.env"
    for line in env.read_text().splitlines() if env.is_file() else []:
        key, _, value = line.partition("=")
        data[key] = value.strip('"')
    return data


def verify_rows(report: dict | None) -> list[tuple[str, str]]:
    rows = []
    for r in (report or {}).get("verify", {}).get("results", []):
        detail = f"max|diff| {r['max_abs_diff']:.2e} (atol {r['atol']}, rtol {r['rtol']})" if "max_abs_diff" in r else ""
        rows.append((f"  {r['check']}", f"{'ok' if r['ok'] else 'FAIL'} {detail}{r.get('error', '')}".strip()))
    return rows


def main(out: Path) -> None:
    fig = figures(out)
    steps = {name: load(out, f"{name}.json") for name in
             ("apex_A", "apex_B", "apex_reinstall", "apex_verify", "ds", "ratio_target", "ratio_default")}
    rows: list[tuple[str, str]] = [("machine", f"{fig.get('gpu')}, {fig.get('cores')} cores, {fig.get('mem_total_gib')} GiB, "
                                    f"torch {fig.get('torch')}, pip {fig.get('pip')}")]
    a = steps["apex_A"]
    if a:
        plan, res = a.get("plan", {}), a.get("result", {})
        par = plan.get("parallelism", {})
        rows += [("apex default set", f"{len(plan.get('expected_extensions', []))} extensions, arch {plan.get('arch_list')}, "
                  f"APEX_PARALLEL_BUILD={par.get('extensions')} MAX_JOBS={par.get('max_jobs')}"),
                 ("  compile (cache entry build_seconds)", f"{res.get('build_seconds')} s"),
                 ("  process A wall (preflight+build+install+verify)", f"{fig.get('apex_A_wall_s')} s, exit {fig.get('apex_A_exit')}"),
                 ("  process B (same cache, started while A compiled)",
                  f"{fig.get('apex_B_wall_s')} s, exit {fig.get('apex_B_exit')}, built={((steps['apex_B'] or {}).get('result') or {}).get('built')}"),
                 ("  compiles for both processes", fig.get("apex_compiles", "?")),
                 ("  peak memory used during the builds", f"{fig.get('peak_mem_used_gib')} GiB")]
        rows += verify_rows(a)
    if steps["apex_verify"] and not a:
        rows.append(("apex --verify-only", f"{fig.get('apex_verify_wall_s')} s, exit {fig.get('apex_verify_exit')}"))
        rows += verify_rows(steps["apex_verify"])
    if steps["apex_reinstall"]:
        rows.append(("apex reinstall from cache (no verify)", f"{fig.get('apex_reinstall_wall_s')} s, exit {fig.get('apex_reinstall_exit')}, "
                     f"built={steps['apex_reinstall'].get('result', {}).get('built')}"))
        rows.append(("apex --verify-only", f"{fig.get('apex_verify_wall_s')} s, exit {fig.get('apex_verify_exit')}"))
    t, d = steps["ratio_target"], steps["ratio_default"]
    if t or d:
        ts = ((t or {}).get("result") or {}).get("build_seconds")
        ds = ((d or {}).get("result") or {}).get("build_seconds")
        rows.append(("subset apex_C,amp_C,fused_layer_norm_cuda", ""))
        rows.append((f"  targeted arch {fig.get('ratio_target_arch')}", f"{ts} s (wall {fig.get('ratio_target_wall_s')} s)"))
        rows.append((f"  apex default {fig.get('ratio_default_arch')}", f"{ds} s (wall {fig.get('ratio_default_wall_s')} s)"))
        if ts and ds:
            rows.append(("  default / targeted", f"{ds / ts:.2f}x"))
    if steps["ds"]:
        plan, res = steps["ds"].get("plan", {}), steps["ds"].get("result") or {}
        rows.append((f"DeepSpeed {plan.get('version')} ops {','.join(plan.get('ops', []))}",
                     f"arch {plan.get('arch_list')}, build {res.get('build_seconds')} s, wall {fig.get('ds_wall_s')} s, exit {fig.get('ds_exit')}"))
        rows += verify_rows(steps["ds"])
    for name, step in steps.items():
        for f in (step or {}).get("findings", []):
            if f["severity"] == "error":
                rows.append((f"{name}: finding {f['code']}", f"{f['message']} (fix: {f['fix']})"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    errors = {name: tail(out, f"{name}.err") for name in steps if (out / f"{name}.err").is_file()}
    (out / "results.json").write_text(json.dumps({"figures": fig, "steps": steps, "stderr_tails": errors}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
