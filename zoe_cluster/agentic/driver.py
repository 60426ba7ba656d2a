"""The closed-loop session driver: which request is released when, independent of the clock that runs it.

The driver holds N live sessions. Each (sub-)agent of a session walks its trace items in order:

- a request is released when the previous request of the same agent finished, plus its `think_time` (capped by
  `think_cap_s`, like AgentX's idle cap); an agent's first request is released at once;
- a run of consecutive sub-agent entries is spawned together when the agent reaches it (each sub-agent starts its
  own walk), and the agent resumes after the last of them finished, with its next request's think time;
- a session ends when its top-level agent has walked every item; the next session instance takes its place;
- the first N sessions start at once, or spread evenly over `ramp_up_s` (so that a file replayed by two users at
  once is not replayed in lockstep: with more live sessions than files, instance k and k + files would otherwise
  send the same requests at the same instants for the whole run).

With `total_sessions` larger than the files given, instances cycle over them; a repeated file is a new user
(its "local" ids get a new scope, `prompts.scope_number`).

The caller owns the clock: `start(now)`, then `due(now)` / `next_release_s()` to send what is released, and
`finished(call, now, ok)` when a response ends (a failed request counts as finished, and the agent goes on).
The virtual clock (`zoe sim replay --sessions`) and the live one (`zoe bench agentic`) drive this same class.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from zoe_cluster.agentic.prompts import Scaling, block_key, prompt_text, scale_request, scope_number
from zoe_cluster.agentic.trace import AgentRequest, Session, SubAgent


@dataclass(frozen=True, slots=True)
class Call:
    """One request the driver releases."""

    request_id: str
    session_key: str
    """Affinity key sent as `x-session-id` and `user`: "<instance>:<session id>", a sub-agent's is
    "<parent key>/<agent_id>"."""
    release_s: float
    input_tokens: int
    output_tokens: int
    block_keys: tuple[int, ...]
    """One key per full block of `block_tokens` (`prompts.block_key`)."""
    block_tokens: int
    reusable_blocks: int
    """Leading blocks whose keys appeared earlier in the same session instance (the reuse ceiling's share)."""
    warmup: bool
    """Released among the first `warmup_requests`: sent, but left out of the metrics."""
    source: AgentRequest

    def prompt(self) -> str:
        return prompt_text(self.block_keys, self.block_tokens, self.input_tokens, self.request_id)


@dataclass(eq=False)
class _Agent:
    items: tuple[AgentRequest | SubAgent, ...]
    key: str
    instance: _Instance
    parent: _Agent | None
    pos: int = 0
    children_left: int = 0
    started: bool = False


@dataclass(eq=False)
class _Instance:
    number: int
    session: Session
    scope: int
    seen: set[int] = field(default_factory=set)


class SessionDriver:
    """See the module docstring."""

    def __init__(self, sessions: list[Session], live_sessions: int, *, total_sessions: int | None = None,
                 think_cap_s: float | None = 60.0, scaling: Scaling = Scaling(), salt: int = 0,
                 warmup_requests: int = 0, ramp_up_s: float = 0.0) -> None:
        if not sessions:
            raise ValueError("no sessions")
        if live_sessions <= 0:
            raise ValueError(f"live sessions must be positive, got {live_sessions}")
        if think_cap_s is not None and think_cap_s < 0:
            raise ValueError(f"think cap must be >= 0, got {think_cap_s}")
        self.sessions = sessions
        self.live_sessions = live_sessions
        self.total_sessions = total_sessions if total_sessions is not None else max(live_sessions, len(sessions))
        if self.total_sessions <= 0:
            raise ValueError(f"total sessions must be positive, got {self.total_sessions}")
        if ramp_up_s < 0:
            raise ValueError(f"ramp-up must be >= 0 s, got {ramp_up_s}")
        self.think_cap_s = think_cap_s
        self.ramp_up_s = ramp_up_s
        self.scaling = scaling
        self.salt = salt
        self.warmup_requests = warmup_requests
        self._heap: list[tuple[float, int, Call, _Agent]] = []
        self._agent_of: dict[str, _Agent] = {}
        self._seq = 0
        self._next_instance = 0
        self.live = 0
        self.released = 0
        self.sessions_done = 0

    # --- the caller's side ----------------------------------------------------------------------------------
    def start(self, now: float = 0.0) -> None:
        """Start the first live sessions: the k-th of n at now + k/n x `ramp_up_s`."""
        n = min(self.live_sessions, self.total_sessions)
        for k in range(n):
            self._start_instance(now + self.ramp_up_s * k / n)

    def planned_requests(self) -> int:
        """Requests the whole run releases (every session instance's requests, sub-agents' included)."""
        per = [len(s.requests()) for s in self.sessions]
        return sum(per[i % len(per)] for i in range(self.total_sessions))

    @property
    def done(self) -> bool:
        """Every session instance has finished."""
        return self.sessions_done >= self.total_sessions

    def next_release_s(self) -> float:
        """When the earliest pending request is released (inf when none is pending)."""
        return self._heap[0][0] if self._heap else float("inf")

    def due(self, now: float) -> list[Call]:
        """Pop every request released at or before `now`, in release order."""
        out: list[Call] = []
        while self._heap and self._heap[0][0] <= now:
            _, _, call, agent = heapq.heappop(self._heap)
            self._agent_of[call.request_id] = agent
            out.append(call)
        return out

    def pop(self) -> Call:
        """Pop the earliest pending request (the virtual clock jumps to its release time)."""
        _, _, call, agent = heapq.heappop(self._heap)
        self._agent_of[call.request_id] = agent
        return call

    def finished(self, call: Call, now: float, ok: bool = True) -> None:
        """The response to `call` ended at `now` (ok or not): its agent moves on."""
        agent = self._agent_of.pop(call.request_id)
        agent.pos += 1
        self._advance(agent, now)

    # --- the state machine ----------------------------------------------------------------------------------
    def _start_instance(self, now: float) -> None:
        n = self._next_instance
        self._next_instance += 1
        session = self.sessions[n % len(self.sessions)]
        copy = n // len(self.sessions)
        local = session.hash_id_scope == "local"
        inst = _Instance(n, session, scope_number(self.salt, n if local else copy))
        self.live += 1
        self._advance(_Agent(session.items, f"{n}:{session.session_id}", inst, None), now)

    def _advance(self, agent: _Agent, now: float) -> None:
        if agent.pos >= len(agent.items):
            self._agent_done(agent, now)
            return
        item = agent.items[agent.pos]
        if isinstance(item, SubAgent):
            group = []
            while agent.pos + len(group) < len(agent.items) and isinstance(agent.items[agent.pos + len(group)], SubAgent):
                group.append(agent.items[agent.pos + len(group)])
            agent.pos += len(group)
            agent.children_left = len(group)
            for sub in group:
                self._advance(_Agent(sub.items, f"{agent.key}/{sub.agent_id}", agent.instance, agent), now)  # type: ignore[union-attr]
            return
        delay = item.think_time_s if agent.started else 0.0
        if self.think_cap_s is not None:
            delay = min(delay, self.think_cap_s)
        agent.started = True
        self._release(agent, item, now + delay)

    def _agent_done(self, agent: _Agent, now: float) -> None:
        parent = agent.parent
        if parent is None:
            self.live -= 1
            self.sessions_done += 1
            if self._next_instance < self.total_sessions:
                self._start_instance(now)
            return
        parent.children_left -= 1
        if parent.children_left == 0:
            self._advance(parent, now)

    def _release(self, agent: _Agent, req: AgentRequest, at: float) -> None:
        inst = agent.instance
        session = inst.session
        blocks, n_in, n_out = scale_request(req.input_tokens, req.output_tokens, len(req.hash_ids),
                                            session.block_size, self.scaling)
        keys = tuple(block_key(inst.scope, h) for h in req.hash_ids[:blocks])
        reusable = 0
        for k in keys:
            if k not in inst.seen:
                break
            reusable += 1
        inst.seen.update(keys)
        call = Call(
            request_id=f"s{inst.number}-{self.released}", session_key=agent.key, release_s=at, input_tokens=n_in,
            output_tokens=n_out, block_keys=keys, block_tokens=self.scaling.block_tokens or session.block_size,
            reusable_blocks=reusable, warmup=self.released < self.warmup_requests, source=req,
        )
        self.released += 1
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, call, agent))
