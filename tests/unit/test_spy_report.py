"""benchmarks.spy's reading of py-spy's raw output: samples land in the right layer and frame."""

from __future__ import annotations

from benchmarks.spy import layer_of, parse_raw, summarise

RAW = """\
run (/usr/lib/python3.11/threading.py);resolve (/x/identity_server/service.py);decide (/x/identity_server/matching.py) 6
run (/usr/lib/python3.11/threading.py);resolve (/x/identity_server/service.py);__init__ (<string>) 2
run (/usr/lib/python3.11/threading.py);_run (/usr/lib/python3.11/asyncio/events.py);0x7f01 (/v/site-packages/grpc/_cython/cygrpc.so) 1
run (/usr/lib/python3.11/threading.py);gc_collect_main (/usr/lib/libpython3.11.so.1.0) 1
a line that is not a stack
"""


def test_stacks_are_read_root_first_with_their_counts() -> None:
    stacks = parse_raw(RAW)
    assert [n for _, n in stacks] == [6, 2, 1, 1]
    assert stacks[0][0][-1] == ("decide", "/x/identity_server/matching.py")


def test_layers_by_file() -> None:
    assert layer_of("/x/identity_server/index.py", "get") == "identity_server (ours)"
    assert layer_of("/v/site-packages/grpc/_cython/cygrpc.so", "0x7f01").startswith("gRPC")
    assert layer_of("/usr/lib/python3.11/asyncio/events.py", "_run").startswith("asyncio")
    assert layer_of("/usr/lib/libpython3.11.so.1.0", "gc_collect_main").startswith("CPython")
    assert layer_of("/usr/lib/python3.11/inspect.py", "isawaitable").startswith("Python stdlib")


def test_summary_shares_and_generated_inits_charged_to_their_caller() -> None:
    report = summarise(parse_raw(RAW), seconds=1.0, rate=20)
    assert "GIL held in 10 of ~20 samples (50% of wall time)" in report
    assert "| identity_server (ours) | 80.0% |" in report  # decide's 6 and the dataclass's 2
    assert "| resolve (identity_server/service.py) | 20.0% |" in report  # own: the __init__
    assert "| resolve (identity_server/service.py) | 80.0% |" in report  # inclusive
    assert "| gRPC (Python, Cython, core) | 10.0% |" in report
