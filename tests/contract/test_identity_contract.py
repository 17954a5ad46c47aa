"""What the ingest client relies on from IdentityService, checked against stub and real server."""

from __future__ import annotations

import pytest

from identity_client import IdentityClient, IdentityError, ItemFailure, Resolution


def test_new_then_exact_then_case(identity: IdentityClient) -> None:
    first = identity.resolve("Ada Lovelace", "person", context_id="paper-1")
    assert (first.match_kind, first.created, first.status) == ("new", True, "provisional")
    assert first.entity_id and first.display_form == "Ada Lovelace"
    again = identity.resolve("Ada Lovelace", "person", context_id="paper-2")
    assert (again.entity_id, again.match_kind, again.created) == (first.entity_id, "exact", False)
    upper = identity.resolve("ADA LOVELACE", "person")
    assert (upper.entity_id, upper.match_kind) == (first.entity_id, "case")


def test_batch_keeps_order_sees_earlier_items_and_isolates_bad_ones(
        identity: IdentityClient) -> None:
    results = identity.resolve_batch(
        "paper-7", [("Graphene Oxide", "material"), ("   ", "material"),
                    ("graphene oxide", "material"), ("x" * 600, "material")]).outcomes
    assert len(results) == 4
    a, bad, b, big = results
    assert isinstance(a, Resolution) and isinstance(b, Resolution)
    assert (a.match_kind, a.created) == ("new", True)
    assert (b.entity_id, b.match_kind, b.created) == (a.entity_id, "case", False)
    assert isinstance(bad, ItemFailure) and bad.code == "INVALID_ARGUMENT" and bad.message
    assert isinstance(big, ItemFailure) and big.code == "INVALID_ARGUMENT"


def test_batch_with_a_context_is_idempotent(identity: IdentityClient) -> None:
    mentions = [("Perovskite Solar Cell", "material"), ("PEROVSKITE SOLAR CELL", "material"),
                ("Spin Coating", "method")]
    first = identity.resolve_batch("paper-9", mentions)
    second = identity.resolve_batch("paper-9", mentions)
    assert first.outcomes == second.outcomes
    assert [r.created for r in first.outcomes if isinstance(r, Resolution)] == [True, False, True]
    assert (first.replayed, second.replayed) == (False, True)  # the reply says it is a replay
    looked = identity.resolve_batch("paper-9", mentions, lookup_only=True)
    assert not looked.replayed
    assert [r.match_kind for r in looked.outcomes if isinstance(r, Resolution)] == [
        "exact", "exact", "exact"]  # the upper-case spelling is a surface form by now
    other = identity.resolve_batch("paper-10", mentions)  # another context: resolved afresh
    assert not other.replayed


def test_lookup_only_writes_nothing(identity: IdentityClient) -> None:
    look = identity.resolve("Never Seen Widget", "tool", lookup_only=True)
    assert (look.entity_id, look.match_kind, look.created) == ("", "new", False)
    made = identity.resolve("Never Seen Widget", "tool")
    assert made.created


def test_oversized_single_resolve_is_invalid_argument(identity: IdentityClient) -> None:
    with pytest.raises(IdentityError) as exc:
        identity.resolve("y" * 600, "concept")
    assert exc.value.code == "INVALID_ARGUMENT"


def test_unknown_entity_is_not_found(identity: IdentityClient) -> None:
    known = identity.resolve("Some Known Thing", "concept").entity_id
    with pytest.raises(IdentityError) as exc:
        identity.get_entity(known + "0")
    assert exc.value.code == "NOT_FOUND"


def test_merge_redirects_and_is_on_the_change_feed(identity: IdentityClient) -> None:
    source = identity.resolve("Alpha Widget Method", "method").entity_id
    target = identity.resolve("Zeta Gadget Approach", "method").entity_id
    merged = identity.merge(source, target)
    assert merged.entity_id == target
    info = identity.get_entity(source)
    assert (info.status, info.redirect_to) == ("merged", target)
    assert identity.resolve("Alpha Widget Method", "method").entity_id == target
    changes = list(identity.list_changes(0))
    assert [c.sequence for c in changes] == sorted(c.sequence for c in changes)
    merges = [(c.entity_id, c.other_id) for c in changes if c.kind == "merged"]
    assert merges == [(source, target)]
    last = changes[-1].sequence
    assert list(identity.list_changes(last)) == []


def test_admin_calls_need_the_token(identity: IdentityClient) -> None:
    a = identity.resolve("Beta Thing One", "tool").entity_id
    b = identity.resolve("Gamma Thing Two", "tool").entity_id
    anonymous = IdentityClient(identity.target, policy=identity.policy)
    try:
        with pytest.raises(IdentityError) as exc:
            anonymous.merge(a, b)
        assert exc.value.code == "UNAUTHENTICATED"
    finally:
        anonymous.close()
