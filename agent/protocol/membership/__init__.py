"""Membership: who takes part in which round, without a consensus protocol (coordination.py
says how), along its seams: the views and their checks (views.py), the fleet's evidence of
silence (witnesses.py), quorum and where a view applies from (quorum.py), joining and
admission (admission.py), the first view (first_view.py), what a status says (statuses.py)."""

from agent.protocol.membership.admission import Admission, ModelIdentity, Refusal, admits, refusal
from agent.protocol.membership.coordination import Membership
from agent.protocol.membership.first_view import MAX_FIRST_EPOCH, FirstView, StartupGate, first_view
from agent.protocol.membership.quorum import (
    LEAD_ROUNDS,
    MassDownHold,
    first_round,
    front,
    has_quorum,
    keeps_quorum,
)
from agent.protocol.membership.statuses import (
    LIVE_STATES,
    StatusSource,
    cut_off,
    fleet_finished,
    sites_of,
    speaks_at,
    status_source,
)
from agent.protocol.membership.views import PublishView, Tuning, ViewBook, view_root, view_tree
from agent.protocol.membership.witnesses import (
    SUSPICION_ROUNDS,
    SUSPICION_RTTS,
    SuspicionRound,
    Witnesses,
    suspicion_round,
)

__all__ = [
    "LEAD_ROUNDS", "LIVE_STATES", "MAX_FIRST_EPOCH", "SUSPICION_ROUNDS", "SUSPICION_RTTS", "Admission",
    "FirstView", "MassDownHold", "Membership", "ModelIdentity", "PublishView", "Refusal", "StartupGate",
    "StatusSource", "SuspicionRound", "Tuning", "ViewBook", "Witnesses", "admits", "cut_off", "first_round",
    "first_view", "fleet_finished", "front", "has_quorum", "keeps_quorum", "refusal", "sites_of", "speaks_at",
    "status_source", "suspicion_round", "view_root", "view_tree",
]
