"""Regenerate the Python stubs for protos/*.proto (run from anywhere).

The stubs are committed so that the services run without grpcio-tools;
tests/unit/test_protos_fresh.py fails when they no longer match the .proto.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = ["protos/grpc_predict_v2.proto"]
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) into out_dir, return the files written."""
    from grpc_tools import protoc  # dev dependency only

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(ROOT / p) for p in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for src in generate(Path(tmp)):
            dest = ROOT / src.relative_to(tmp)
            dest.write_bytes(src.read_bytes())
            print(f"wrote {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
