"""Write a flat TrainConfig back as TOML (the run's resolved config, loadable with --config)."""

from __future__ import annotations

import json
import math


def value_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return json.dumps(str(value))  # JSON string escapes are valid TOML basic-string escapes


def dumps(flat: dict, header: str = "") -> str:
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{key} = {value_text(value)}" for key, value in flat.items()]
    return "\n".join(lines) + "\n"
