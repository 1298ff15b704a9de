"""What the package reads of PyPI: a pyproject [project] table's requires_dist as pixi locks it, and a
registry's simple API (PEP 691) for `lock check --online`."""

from __future__ import annotations

import json
import urllib.request

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gptforge.errors import GptforgeError

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def format_requirement(text: str) -> str:
    """A requirement as pixi writes it in requires_dist: `name[extra]>=1 ; marker == 'x'`."""
    req = Requirement(text)
    out = req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "")
    out += f" @ {req.url}" if req.url else ",".join(sorted(str(s) for s in req.specifier))
    return out + (f" ; {str(req.marker).replace(chr(34), chr(39))}" if req.marker else "")


def with_extra_marker(text: str, extra: str) -> str:
    """An optional dependency as it enters requires_dist: its marker and-ed with `extra == 'group'`."""
    req = Requirement(text)
    marker = f"extra == '{canonicalize_name(extra)}'"
    req.marker = Marker(f"({req.marker}) and {marker}" if req.marker else marker)
    return str(req)


def pyproject_requires_dist(project: dict) -> tuple[str, ...]:
    """requires_dist of a pyproject.toml [project] table as uv reads it statically (and pixi locks it):
    the dependencies, then each optional-dependencies group's entries in declaration order."""
    out = [format_requirement(r) for r in project.get("dependencies", ())]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        out += [format_requirement(with_extra_marker(r, extra)) for r in requirements]
    return tuple(out)


def registry_get(url: str, accept: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read()
    except OSError as err:
        raise GptforgeError(f"{url}: {err}", "the registry must be reachable for this step") from None


def simple_files(index: str, name: str) -> list[dict]:
    url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
    return json.loads(registry_get(url, SIMPLE_JSON))["files"]
