"""What a router knows about the sessions it routes: which replica holds each one's chain, whether it is running
a request or thinking (its last request finished and no new one came yet: a tool call, a user pause), and how much
KV its chain holds. Pure bookkeeping on the policy's clock; the `prefix` policy reads it.

Session keys come from `RequestContext.session` (`x-session-id`, or the OpenAI `user` field). A sub-agent's key is
`<parent session>/<agent id>` (as the closed-loop driver `zoe_cluster.agentic` sends them): `family` is the part
before the first "/", so sibling sub-agents of one parent are known as such.

A session with nothing in flight that has not been seen for `idle_s` is forgotten (the run or the user ended it):
its replica stops counting it. Expiry is lazy, oldest first, whenever the clock is read.

Routers behind one front share their tables (`routing.picture_sharing`): each live session's latest routing is
numbered (`next_seq`), a peer takes those after the last number it took (`routed_since`, one entry per session, so
at most `max_sessions`) and binds them in its own table (`absorb`, not numbered again).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


def session_family(session: str) -> tuple[str, str | None]:
    """(parent key, agent id) of a session key: ("s1", "agent_001") for "s1/agent_001", ("s1", None) for "s1"."""
    parent, sep, agent = session.partition("/")
    return (parent, agent or None) if sep else (session, None)


@dataclass(slots=True)
class SessionState:
    replica_id: str
    """Where its chain is (the replica its last request went to)."""
    family: str
    subagent: bool
    in_flight: int = 0
    last_s: float = 0.0
    """Last request routed or finished, on the policy's clock (seconds)."""
    context_tokens: int = 0
    """Prompt + output tokens of its latest request: the KV its chain holds on `replica_id`."""
    moves: int = 0
    """Times the session was moved off a saturated replica."""

    @property
    def thinking(self) -> bool:
        return self.in_flight == 0


@dataclass(slots=True)
class ReplicaSessions:
    """Live sessions bound to one replica."""

    sessions: int = 0
    context_tokens: int = 0
    """KV tokens their chains hold (the sum of their `context_tokens`)."""
    thinking: int = 0


class SessionTable:
    """Session -> SessionState, least recently active first, with per-replica sums kept incrementally."""

    def __init__(self, max_sessions: int, idle_s: float) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._s: OrderedDict[str, SessionState] = OrderedDict()
        self._per: dict[str, ReplicaSessions] = {}
        self._siblings: dict[tuple[str, str], int] = {}  # (family, replica) -> live sub-agents bound there
        self.moves = 0
        self._log: OrderedDict[str, int] = OrderedDict()  # live session -> number of its latest routing, oldest first
        self._next_seq = 1

    def __len__(self) -> int:
        return len(self._s)

    def get(self, session: str) -> SessionState | None:
        return self._s.get(session)

    def on_replica(self, replica_id: str) -> ReplicaSessions:
        return self._per.get(replica_id) or ReplicaSessions()

    def siblings_on(self, family: str, replica_id: str) -> int:
        return self._siblings.get((family, replica_id), 0)

    def expire(self, now: float) -> None:
        """Forget sessions idle for longer than `idle_s` (oldest first) and any beyond `max_sessions`."""
        s = self._s
        while s:
            key, st = next(iter(s.items()))
            if len(s) > self.max_sessions or (st.in_flight == 0 and now - st.last_s > self.idle_s):
                self._forget(key)
            else:
                break

    def routed(self, session: str, replica_id: str, context_tokens: int, now: float) -> SessionState:
        """A request of `session` was sent to `replica_id`."""
        st = self._s.get(session)
        if st is None:
            family, agent = session_family(session)
            st = self._s[session] = SessionState(replica_id, family, agent is not None)
            self._add(st, 1)
            self._per[replica_id].thinking += 1  # counted as thinking until in_flight rises below
        elif st.replica_id != replica_id:
            self._add(st, -1)
            if st.thinking:
                self._per[st.replica_id].thinking -= 1
            st.replica_id = replica_id
            st.moves += 1
            self.moves += 1
            self._add(st, 1)
            if st.thinking:
                self._per[replica_id].thinking += 1
        per = self._per[replica_id]
        per.context_tokens += context_tokens - st.context_tokens
        st.context_tokens = context_tokens
        if st.in_flight == 0:
            per.thinking -= 1
        st.in_flight += 1
        st.last_s = now
        self._s.move_to_end(session)
        self._log[session] = self._next_seq
        self._log.move_to_end(session)
        self._next_seq += 1
        return st

    def finished(self, session: str, now: float) -> None:
        """A request of `session` ended; with nothing else in flight the session is thinking."""
        st = self._s.get(session)
        if st is None or st.in_flight == 0:
            return
        st.in_flight -= 1
        if st.in_flight == 0:
            self._per[st.replica_id].thinking += 1
        st.last_s = max(st.last_s, now)
        self._s.move_to_end(session)

    def drop_replica(self, replica_id: str) -> None:
        """The replica left: its sessions are forgotten (their chains went with it)."""
        for key in [k for k, st in self._s.items() if st.replica_id == replica_id]:
            self._forget(key)
        self._per.pop(replica_id, None)

    @property
    def next_seq(self) -> int:
        """The number the next routing will take."""
        return self._next_seq

    def routed_since(self, seq: int, now: float) -> list[tuple[str, str, int, float]]:
        """(session, replica id, context tokens, seconds since it was last active) of each live session whose latest
        routing here is numbered `seq` or later (all when `seq` is past `next_seq`: a new table), oldest first."""
        if seq > self._next_seq:
            seq = 0
        out = []
        for key, n in reversed(self._log.items()):
            if n < seq:
                break
            st = self._s[key]
            out.append((key, st.replica_id, st.context_tokens, max(0.0, now - st.last_s)))
        out.reverse()
        return out

    def absorb(self, entries: list[tuple[str, str, int, float]], now: float) -> int:
        """Bind a peer's `routed_since` entries here, without numbering them: a session unknown here, or last active
        here before the peer routed it and with nothing in flight here, follows the peer's replica (as thinking: its
        request runs on the peer). Returns the sessions bound."""
        taken = 0
        for session, replica_id, context_tokens, age_s in entries:
            t = now - age_s
            st = self._s.get(session)
            if st is not None and (st.in_flight or st.last_s >= t):
                continue
            if st is None:
                family, agent = session_family(session)
                st = self._s[session] = SessionState(replica_id, family, agent is not None)
                self._add(st, 1)
                self._per[replica_id].thinking += 1
            elif st.replica_id != replica_id:
                self._add(st, -1)
                self._per[st.replica_id].thinking -= 1
                st.replica_id = replica_id
                self._add(st, 1)
                self._per[replica_id].thinking += 1
            self._per[replica_id].context_tokens += context_tokens - st.context_tokens
            st.context_tokens = context_tokens
            st.last_s = t
            self._s.move_to_end(session)
            taken += 1
        self.expire(now)
        return taken

    def _forget(self, key: str) -> None:
        self._log.pop(key, None)
        st = self._s.pop(key)
        if st.thinking:
            self._per[st.replica_id].thinking -= 1
        self._add(st, -1)

    def _add(self, st: SessionState, sign: int) -> None:
        per = self._per.setdefault(st.replica_id, ReplicaSessions())
        per.sessions += sign
        if sign < 0:
            per.context_tokens -= st.context_tokens
        else:
            per.context_tokens += st.context_tokens
        if st.subagent:
            k = (st.family, st.replica_id)
            self._siblings[k] = self._siblings.get(k, 0) + sign
            if self._siblings[k] <= 0:
                del self._siblings[k]
