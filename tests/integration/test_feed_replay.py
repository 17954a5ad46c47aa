"""An index caught up from the change feed equals the store, whatever was written.

A process catches its index up with other processes' commits from the change feed: new entities
and surface forms are applied from their events alone (`unit.replayed`), every other change by
reading its entities again from the store. Here two services share a store and take turns with
random writes (resolves of colliding, case, punctuation and typo spellings under paper ids,
merges, aliases, promotions, settled links, authority imports); after each round, each
service's index must hold every entity exactly as the store does.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from identity_server.domain import Entity
from identity_server.errors import FailedPrecondition
from identity_server.server import build_service
from identity_server.service import IdentityService
from identity_server.settings import Settings
from tests.conftest import store_url

SPELLINGS = ["Grace Hopper", "grace hopper", "Grace-Hopper", "Grace Hoppr", "Ada Lovelace",
             "ADA LOVELACE", "Ada Lovelase", "COBOL", "Cobol", "Jordan Smith", "Jordan Smyth",
             "Analytical Engine", "Analytic Engine", "Difference Engine", "Mars", "Marz"]
TYPES = ["person", "tool", "other"]


def _seen(entity: Entity) -> tuple[object, ...]:
    return (entity.entity_id, entity.entity_type, entity.status, entity.ordinal,
            entity.placeholder, entity.redirect_to,
            sorted((n.display, n.kind.value, n.position) for n in entity.names))


def _check_index_equals_store(service: IdentityService) -> None:
    service.live.read(lambda tx: None)  # catch up with every commit
    with service.store.read() as tx:
        ids = [e.entity_id for e in tx.iter_all_entities()]
        stored = tx.load_entities(ids)
    index = service.index
    assert len(index) == len(stored)
    for eid, entity in stored.items():
        held = index.get(eid)
        assert held is not None, eid
        assert _seen(held) == _seen(entity)


def _write(rng: random.Random, service: IdentityService, step: int) -> None:
    action = rng.random()
    live = [e for e in service.index.entities() if e.redirect_to is None]
    if action < 0.7 or len(live) < 2:
        mentions = [(rng.choice(SPELLINGS), rng.choice(TYPES)) for _ in range(rng.randrange(1, 6))]
        service.resolve_batch(f"paper-{step % 7}", mentions)
        return
    entity = rng.choice(live)
    try:
        if action < 0.78:
            other = rng.choice(live)
            service.merge(entity.entity_id, other.entity_id)
        elif action < 0.84:
            service.add_alias(entity.entity_id, rng.choice(SPELLINGS) + " Jr")
        elif action < 0.9:
            service.promote(entity.entity_id)
        elif action < 0.95:
            links, _ = service.list_links()
            if links:
                link = rng.choice(links)
                service.settle(link.a, link.b, rng.choice(["same", "distinct"]), actor="test",
                               reason="random")
        else:
            service.import_lines([(f'{{"id": "Q{step}", "name": "{rng.choice(SPELLINGS)}", '
                                  f'"type": "{rng.choice(TYPES[:2])}"}}')])
    except FailedPrecondition:
        pass  # a merge or settlement the rules refuse: nothing written


@pytest.mark.parametrize(("backend", "seed"),
                         [("sqlite", seed) for seed in range(6)] + [("postgres", 11)])
def test_two_services_indexes_equal_the_store_after_random_writes(
        backend: str, seed: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = store_url(backend, tmp_path, request)
    a, b = build_service(Settings(db_url=url)), build_service(Settings(db_url=url))
    rng = random.Random(seed)
    try:
        for round_ in range(8):
            for step in range(12):
                _write(rng, rng.choice((a, b)), round_ * 100 + step)
            _check_index_equals_store(a)
            _check_index_equals_store(b)
    finally:
        a.close()
        b.close()
