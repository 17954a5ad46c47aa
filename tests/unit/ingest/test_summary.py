"""The end-of-job summary reads as a sentence: one of a thing is singular."""

from __future__ import annotations

from ingest.pipeline import Summary


def test_counts_of_one_are_singular_and_others_plural() -> None:
    one = Summary(ingested=3, changed=1, rejected_items=1, rejected_lines=1,
                  lines_rejected_before=1, new_entities=1, matched_entities=1)
    text = "\n".join(one.lines())
    assert "papers ingested:   3 (1 changed revision)" in text
    assert "rejected:          1 item, 1 line; 1 line rejected as in an earlier run" in text
    assert "entities:          1 new; 1 mention matched existing ones" in text

    many = Summary(ingested=5, changed=2, rejected_items=0, rejected_lines=2,
                   new_entities=4, matched_entities=0)
    text = "\n".join(many.lines())
    assert "papers ingested:   5 (2 changed revisions)" in text
    assert "rejected:          0 items, 2 lines (see table rejects)" in text
    assert "entities:          4 new; 0 mentions matched existing ones" in text
    assert "earlier run" not in text
