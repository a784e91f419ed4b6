"""The system model of a star: one draft serving N targets (docs/architecture.md section 2).

Notation (times in seconds, throughput in tokens per second):

* One round of one session: the draft proposes ``gamma`` tokens, the target accepts ``l`` of them
  (``0 <= l <= gamma``) and adds one token of its own (the correction or the bonus), so a round commits
  ``l + 1`` tokens.
* ``beta(y) = P(token y accepted | tokens 1..y-1 accepted)``. Tail-sum identity:
  ``E[l] = sum_{y=1..gamma} P(l >= y) = sum_{y=1..gamma} prod_{k<=y} beta(k)``; with a constant ``alpha``,
  ``E[l] + 1 = (1 - alpha^(gamma+1)) / (1 - alpha)``.
* ``tq`` the draft's service time for one request, ``tp`` the target's verify time, ``tc`` the one-way
  transfer time (request or response, serialisation included). A target's cycle without queueing is
  ``C = tq + tp + 2*tc``.
* ``N`` targets on one draft that serves one request at a time: ``rho = min(1, N*tq / C)`` and
  ``O(N) = N * (E[l]+1) / max(C, N*tq)``. Under-loaded when ``N*tq < C`` (the draft idles, throughput grows
  linearly with N); fully loaded when ``N*tq >= C`` (the draft never idles, throughput is capped at
  ``(E[l]+1)/tq``, more targets only queue). ``N* = ceil(1 + (tp + 2*tc)/tq)`` is the smallest fully-loaded N.

Batched drafts: a draft that runs ``B`` waiting requests in one forward pass takes ``Tq(B)`` for the batch, so
each request costs the draft ``Tq(B)/B`` of its time while still waiting ``Tq(B)`` for its own answer. A small
draft is memory-bound: a forward pass is dominated by reading its weights, which is the same for 1 or 8
sequences, so ``Tq(B)`` grows slowly with ``B``, ``Tq(B)/B`` falls almost as ``1/B``, the draft's capacity
``B*(E[l]+1)/Tq(B)`` grows almost ``B``-fold, and one draft feeds many more targets
(``N*_B = ceil(B * (1 + (tp + 2*tc)/Tq(B)))``). See :class:`BatchCurve` and :meth:`StarInputs.point`.

Everything here is a pure function of its arguments; bad arguments raise ``ValueError`` naming the argument.
:class:`StarInputs` holds the inputs once (the unbatched draft as the one-point batch curve ``((1, tq),)``);
the functions that take the times one by one are the same computations over it. The modules:
``acceptance`` (``E[l]``), ``one_draft`` (the closed forms), ``curve`` (``Tq(B)``), ``inputs``
(:class:`StarInputs`, one draft with ``n`` targets), ``table`` (``starsd plan``'s rows), ``stars``
(several drafts, the best ``(D, N)``).
"""

from starsd.system_model.acceptance import (
    accepted_length_distribution,
    accepted_length_tail,
    expected_accepted_length,
    expected_tokens_per_round,
    position_acceptance,
)
from starsd.system_model.curve import BatchCurve, batched_capacity, batched_optimal_targets
from starsd.system_model.inputs import BatchedPoint, StarInputs, batched_point, batched_throughput
from starsd.system_model.one_draft import (
    Regime,
    cycle_time,
    draft_capacity,
    optimal_targets,
    per_target_latency,
    regime,
    round_time,
    throughput,
    utilization,
)
from starsd.system_model.stars import (
    Costs,
    StarOption,
    StarPlan,
    best_star,
    best_star_for,
    split_targets,
    star_capacity,
    star_option,
    star_option_for,
    star_throughput,
    star_throughput_for,
)
from starsd.system_model.table import PlanRow, plan, plan_table

__all__ = [
    "BatchCurve",
    "BatchedPoint",
    "Costs",
    "PlanRow",
    "Regime",
    "StarInputs",
    "StarOption",
    "StarPlan",
    "accepted_length_distribution",
    "accepted_length_tail",
    "batched_capacity",
    "batched_optimal_targets",
    "batched_point",
    "batched_throughput",
    "best_star",
    "best_star_for",
    "cycle_time",
    "draft_capacity",
    "expected_accepted_length",
    "expected_tokens_per_round",
    "optimal_targets",
    "per_target_latency",
    "plan",
    "plan_table",
    "position_acceptance",
    "regime",
    "round_time",
    "split_targets",
    "star_capacity",
    "star_option",
    "star_option_for",
    "star_throughput",
    "star_throughput_for",
    "throughput",
    "utilization",
]
