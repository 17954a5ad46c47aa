"""Contract fixtures: the same client-side assertions run against the stub and the real server."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from identity_client import IdentityClient, RetryPolicy
from ingest.testing import serve_stub

ADMIN_TOKEN = "contract-secret"
HAVE_REAL_SERVER = importlib.util.find_spec("identity_server.server") is not None
POLICY = RetryPolicy(deadline_seconds=10.0, budget_seconds=10.0, initial_backoff=0.02)


@pytest.fixture(params=["stub", "real"])
def identity(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IdentityClient]:
    """A client (with the admin token) of a fresh stub or a fresh real server on port 0."""
    if request.param == "stub":
        with serve_stub(admin_token=ADMIN_TOKEN) as stub, \
                IdentityClient(stub.address, policy=POLICY, admin_token=ADMIN_TOKEN) as client:
            yield client
        return
    if not HAVE_REAL_SERVER:
        pytest.skip("identity_server.server is not there yet")
    from identity_server.server import start_server
    from identity_server.settings import Settings

    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'identity.sqlite'}", port=0,
                                    admin_token=ADMIN_TOKEN))
    try:
        with IdentityClient(f"127.0.0.1:{running.port}", policy=POLICY,
                            admin_token=ADMIN_TOKEN) as client:
            yield client
    finally:
        running.stop(grace=0.5)
