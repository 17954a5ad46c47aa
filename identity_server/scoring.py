"""Candidate scores (0-100), the same in gRPC replies and in reconciliation: rapidfuzz's
similarity of the mention to the name each candidate matched through (casefolded), capped so
that the rules' order holds. No candidate scores above the one before it in the rules' order,
and when the rules converge, every other candidate scores below the winner."""

from __future__ import annotations

from rapidfuzz import fuzz

from identity_server.matching import Decision, Outcome
from identity_server.normalize import fold


def similarity(display: str, matched_name: str) -> float:
    """How alike the mention and a candidate's matched name read, 0-100 (one decimal)."""
    return round(fuzz.ratio(fold(display), fold(matched_name)), 1)


def candidate_scores(decision: Decision, display: str) -> tuple[float, ...]:
    """The score of each of the decision's candidates, in its order."""
    return capped(decision, [similarity(display, c.matched_name) for c in decision.candidates])


def capped(decision: Decision, similarities: list[float]) -> tuple[float, ...]:
    """The scores of candidates whose similarities are given, in the decision's order: each
    capped by the one before it, and below the winner's when the rules converge."""
    converged = decision.outcome is Outcome.CONVERGED
    scores: list[float] = []
    for score in similarities:
        if scores:
            score = min(score, scores[-1])
            if converged:
                score = min(score, scores[0] - 1)
        scores.append(max(score, 0.0))
    return tuple(scores)


__all__ = ["candidate_scores", "capped", "similarity"]
