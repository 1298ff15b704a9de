"""What several rule modules share: a version floor compare and the fix hints they join."""

from __future__ import annotations

from packaging.version import Version

from gptforge.compat import project_envs
from gptforge.compat.context import Context
from gptforge.core.versions import DriverVersion


def at_least(version: Version, minimum: Version) -> bool:
    """Compare only the components the user gave: gcc '11' satisfies a minimum of 11.3."""
    given = len(version.release)
    return version.release >= minimum.release[:given]


def env_hint(ctx: Context, suggest: bool, *, driver: DriverVersion | None = None) -> str | None:
    """'use the cuda-12-6 environment: pixi run -e cuda-12-6 setup (without pixi: ...)' for this machine."""
    if not suggest:
        return None
    env = project_envs.recommend(driver or ctx.driver, ctx.ccs, ctx.judge).chosen
    if env is None or env.cuda is None:
        return None
    return f"use the {env.name} environment: {env.install_hint}"


def join_fixes(*parts: str | None) -> str:
    return "; or ".join(p for p in parts if p)
