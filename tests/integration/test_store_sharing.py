"""A server keeps serving while other processes open, write and close its SQLite store.

SQLite keeps a WAL database's shared-memory index in the `-shm` file, guarded by POSIX locks;
a process that closes any descriptor of that file drops every lock it holds on it, and the next
process to open the store then resets the file under the first one's mapping (a bus error). This
runs a server under load while short-lived processes (the import command, as the README shows)
open, write and close the same store again and again.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from tests.integration.test_concurrency import server_process

SERVER_BIN = Path(sys.executable).with_name("identity-server")
OPENINGS = 8


def test_a_server_outlives_other_processes_opening_its_sqlite_store(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    authority = tmp_path / "authority.jsonl"
    stop = threading.Event()
    failures: list[BaseException] = []
    served = [0]
    with server_process(db_url) as address, grpc.insecure_channel(address) as channel:
        stub = pb_grpc.IdentityServiceStub(channel)

        def load() -> None:  # writes and reads, so the server's SQLite is busy with the WAL
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    stub.Resolve(pb.ResolveRequest(mention=f"Quorbex Network {i}",
                                                   entity_type="method"), timeout=30)
                    stub.Resolve(pb.ResolveRequest(mention=f"QUORBEX network {i}",
                                                   entity_type="method"), timeout=30)
                    served[0] += 2
                except grpc.RpcError as e:
                    failures.append(e)
                    return

        loaders = [threading.Thread(target=load) for _ in range(4)]
        for t in loaders:
            t.start()
        try:
            for n in range(OPENINGS):
                authority.write_text(
                    f'{{"id": "Q{n}", "name": "Vextral Encoder {n}", "type": "method"}}\n',
                    encoding="utf-8")
                subprocess.run([str(SERVER_BIN), "--log-level", "warning", "import",
                                str(authority), "--db", db_url], check=True, timeout=120,
                               capture_output=True)
                time.sleep(0.05)
        finally:
            stop.set()
            for t in loaders:
                t.join(timeout=60)
        assert failures == [], failures[:1]
        assert served[0] > 0
        # Still serving, and it sees what the other processes imported.
        reply = stub.Resolve(pb.ResolveRequest(mention="vextral encoder 0", entity_type="method",
                                               lookup_only=True), timeout=30)
        assert (reply.entity_id, reply.match_kind) == ("Q0", pb.CASE)
