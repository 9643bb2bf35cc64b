"""Write docs/settings.md from the settings classes (their fields' docstrings): every flag and
environment variable of the proxy and the services, never written twice by hand.

    python scripts/settings_reference.py          # rewrite docs/settings.md
    python scripts/settings_reference.py --check  # exit 1 when docs/settings.md is stale

tests/unit/test_settings_reference.py runs the check.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import protos  # noqa: E402
from predictors.settings import PredictorSettings  # noqa: E402
from preprocess.settings import PreprocessSettings  # noqa: E402
from proxy.settings import ProxySettings  # noqa: E402

TARGET = ROOT / "docs" / "settings.md"
_ENV_NOTE = re.compile(r"\s*\[env [A-Z0-9_]+\]$")

SERVICES: list[tuple[str, str, type[BaseSettings]]] = [
    ("The proxy", "python -m proxy", ProxySettings),
    ("The predictor service", "python -m predictors", PredictorSettings),
    ("The preprocess service", "python -m preprocess", PreprocessSettings),
]


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "`" + repr(field.default_factory()) + "`"  # type: ignore[call-arg]
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, Path) and value.is_relative_to(ROOT):
        value = value.relative_to(ROOT)
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


def _text(field: FieldInfo) -> str:
    text = _ENV_NOTE.sub("", field.description or "")
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    out = [
        "# Settings reference",
        "",
        "Generated from the settings classes by `python scripts/settings_reference.py` (a test",
        "fails when this file is stale). Every setting is a flag (`--kebab-case`) and an",
        "environment variable; `--help` prints the same. Endpoints of the services a pipeline",
        "calls are variables of their own, named by the pipeline file (`PREPROCESS_URL`,",
        "`PREDICTOR_DIGITS_MLP_URL`, ...: [pipelines.md](pipelines.md)).",
        "",
        "One variable is grpc's own: every process of the mesh runs with",
        f"`GRPC_EXPERIMENTS={protos.GRPC_EXPERIMENTS}` unless the environment",
        "sets it (protos/__init__.py): grpc's older polling makes half the context switches a",
        "message (bench/README.md, 2026-11-27). Set it (even empty) to choose otherwise.",
    ]
    for title, command, cls in SERVICES:
        prefix = str(cls.model_config.get("env_prefix", ""))
        out += ["", f"## {title} (`{command}`)", ""]
        out += ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
        for name, field in cls.model_fields.items():
            flag = "--" + name.replace("_", "-")
            variable = (prefix + name).upper()
            out.append(f"| `{variable}` | `{flag}` | {_default(field)} | {_text(field)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is stale: run python scripts/settings_reference.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
