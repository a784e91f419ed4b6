"""The operator's one error for a spec it cannot act on.

Every part of the spec's parsing (model sources, pod templates, lifecycle, rollout, disruption budgets) raises
a subclass of :class:`SpecError`, so the controller catches one type and shows its message in ``Ready=False``.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A spec the operator cannot act on; the message names the field."""
