"""The committed protobuf code must be what proto/generate.py makes from proto/ today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_in_step_with_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev extra")
    generator = _generator()
    generator.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert fresh, "the generator produced nothing"
    for rel in fresh:
        committed = ROOT / "proto" / rel
        assert committed.exists(), f"{rel} is generated but not committed"
        assert committed.read_text() == (tmp_path / rel).read_text(), (
            f"{rel} is stale: run `python proto/generate.py` and commit the result"
        )
