"""Regenerate the Python code for the .proto files under proto/.

Run `python proto/generate.py` after editing a .proto file and commit the result; a test
(tests/unit/test_generated_code.py) regenerates into a temp dir and fails on any difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILES = ("identity_api/v1/identity_service.proto",)


def generate(out_dir: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto file into out_dir."""
    from grpc_tools import protoc  # dev dependency: pinned in pyproject's dev extra

    include = Path(protoc.__file__).resolve().parent / "_proto"
    for proto in PROTO_FILES:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(PROTO_ROOT / proto),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {proto} (exit {code})")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
