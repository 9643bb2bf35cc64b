"""docs/extending.md's "new model" walkthrough, followed literally: every block marked
`file=` written, every `bash` block run (servers in the background, stopped after), in a
fresh folder, with free ports in place of the documented ones. It fails when the guide does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from bench.mesh import free_port
from tests.procs import ROOT

GUIDE = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S)


def walkthrough() -> list[tuple[str, str]]:
    """(info, body) of each fenced block of the guide's first section."""
    text = GUIDE.read_text()
    section = text.split("\n## ")[1]
    return [(m["info"].strip(), m["body"]) for m in BLOCK.finditer(section)]


def test_a_new_model_from_an_onnx_file_to_an_answer(tmp_path: Path) -> None:
    ports = {"8201": str(free_port()), "8090": str(free_port())}
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    background: list[subprocess.Popen] = []
    outputs = []
    blocks = walkthrough()
    assert sum(info.startswith("bash") for info, _ in blocks) >= 4
    try:
        for info, body in blocks:
            for documented, free in ports.items():
                body = body.replace(documented, free)
            if "file=" in info:
                path = tmp_path / info.split("file=")[1]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
                continue
            assert info == "bash", info
            for command in body.replace("\\\n", " ").splitlines():
                command = command.split("#")[0].strip() if command.startswith("#") else command
                if not command.strip():
                    continue
                if command.rstrip().endswith("&"):
                    background.append(
                        subprocess.Popen(
                            ["bash", "-c", command.rstrip()[:-1]],
                            cwd=tmp_path,
                            env=env,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            start_new_session=True,  # stopped as a group, bash and its child
                        )
                    )
                    continue
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", command],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, f"{command}: {done.stderr}"
                outputs.append(done.stdout)
    finally:
        for proc in background:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    ready = json.loads(outputs[-2])
    assert ready["ready"], ready
    answer = json.loads(outputs[-1])
    assert answer["pipeline"] == "affine"
    assert answer["result"] == {"y": [[3.0, 5.0, 7.0, 9.0]]}
