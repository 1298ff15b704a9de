"""How to ask pip to build apex with a set of extensions: a pure function of apex's and pip's version.

Rules (compat-facts §6, apex README):
- apex whose setup.py maps env vars to flags (``ENV_TO_FLAG``, PR #1910) reads ``APEX_CPP_EXT=1`` etc.;
  that works with every pip and with uv, so it wins whenever apex supports it.
- Older apex needs the flags on setup.py's command line: pip >= 23.1 passes them with
  ``--config-settings "--build-option=--cpp_ext"``; older pip with ``--global-option=--cpp_ext``.
- Always ``--no-build-isolation``: apex's setup.py imports torch, which an isolated build env lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

CONFIG_SETTINGS_SINCE = Version("23.1")
CORE_FLAGS = ("--cpp_ext", "--cuda_ext")


@dataclass(frozen=True)
class PipFlags:
    env: dict[str, str]
    pip_args: tuple[str, ...]
    style: str  # "env" | "config-settings" | "global-option"


def select_flags(setup_flags: tuple[str, ...], env_to_flag: dict[str, str] | None, pip_version: Version) -> PipFlags:
    """pip arguments and environment that make apex's setup.py see ``setup_flags``.

    ``env_to_flag`` is apex's ``ENV_TO_FLAG`` table read from its setup.py (None when that apex
    predates it).
    """
    base = ("--no-build-isolation",)
    flag_to_env = {flag: env for env, flag in (env_to_flag or {}).items()}
    if env_to_flag is not None and all(flag in flag_to_env for flag in setup_flags):
        return PipFlags({flag_to_env[f]: "1" for f in setup_flags}, base, "env")
    if pip_version >= CONFIG_SETTINGS_SINCE:
        args = tuple(f"--config-settings=--build-option={f}" for f in setup_flags)
        return PipFlags({}, base + args, "config-settings")
    return PipFlags({}, base + tuple(f"--global-option={f}" for f in setup_flags), "global-option")
