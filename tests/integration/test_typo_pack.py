"""The background pack of the typo overlay, seen from the service: answers never change, a
failed pack leaves the overlay serving, and the next one goes ahead."""

from __future__ import annotations

import logging

import pytest

from identity_server.domain import MatchKind
from identity_server.index import NameIndex
from identity_server.service import IdentityService
from identity_server.typo_table import OverlayPack


def _wait_for_pack(service: IdentityService) -> None:
    if service.live._packing is not None:
        service.live._packing.result(timeout=60)


def test_a_failed_pack_keeps_the_overlay_serving_and_the_next_pack_goes_ahead(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    service.live.typo_pack_at = 1
    real_build = NameIndex.build_typo_pack
    failures = []

    def failing_build(pack: OverlayPack) -> None:
        failures.append(pack)
        raise OSError("no room for the new shards")

    monkeypatch.setattr(NameIndex, "build_typo_pack", staticmethod(failing_build))
    with caplog.at_level(logging.ERROR, logger="identity_server.service"):
        made = service.resolve("Quorbex Transformer", "method")
        _wait_for_pack(service)
    assert failures and "packing the typo table failed" in caplog.text
    packed, waiting = service.index.typo_anchors()
    assert (packed, waiting) == (0, 1)  # back in the overlay
    typo = service.resolve("Quorbex Transfromer", "method", lookup_only=True)
    assert (typo.entity_id, typo.match_kind) == (made.entity_id, MatchKind.TYPO)

    monkeypatch.setattr(NameIndex, "build_typo_pack", staticmethod(real_build))
    other = service.resolve("Vextral Autoencoder", "method")
    _wait_for_pack(service)
    assert service.index.typo_anchors() == (0, 2)  # the retry waits: no pack on every write
    service.live._no_pack_before = 0.0  # as when PACK_RETRY_AFTER_S has passed
    service.resolve("Vextral Autoencoder", "method", context_id="paper-1")  # a write
    _wait_for_pack(service)
    assert service.index.typo_anchors() == (2, 0)
    for mention, entity in (("Quorbex Transfromer", made), ("Vextral Autoencodr", other)):
        r = service.resolve(mention, "method", lookup_only=True)
        assert (r.entity_id, r.match_kind) == (entity.entity_id, MatchKind.TYPO)


def test_close_waits_for_a_pack_in_flight(service: IdentityService) -> None:
    service.live.typo_pack_at = 1
    service.resolve("Quorbex Transformer", "method")
    service.close()
    assert service.live._packing is not None and service.live._packing.done()
    assert service.index.typo_anchors() == (1, 0)
