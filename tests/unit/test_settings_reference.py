"""docs/settings.md is generated from the settings classes: it fails here when a setting
changed and the reference was not regenerated (python scripts/settings_reference.py)."""

from __future__ import annotations

import subprocess
import sys

from proxy.settings import ProxySettings
from tests.procs import ROOT

SCRIPT = ROOT / "scripts" / "settings_reference.py"


def test_the_settings_reference_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_proxy_setting_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    for name in ProxySettings.model_fields:
        assert f"`PROXY_{name.upper()}`" in text, name
