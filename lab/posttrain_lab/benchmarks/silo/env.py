"""SILO-BENCH as an RL environment: one policy plays every agent of a case (issue 39).

:class:`SiloEnv` is a :class:`posttrain.envs.MultiAgentEnv` (registered as ``silo``) over the
benchmark's own step-wise engine (:class:`~posttrain_lab.benchmarks.silo.engine.CaseRun`, the loop
that ``posttrain silo run`` runs): each seat's opening messages are the engine's (the protocol's
system prompt with its tool descriptions, the case's user prompt with the agent's shard), each
round the seats' sampled replies are applied in agent order with the benchmark's parser and protocol
rules, and each seat's next observation is the engine's ``<tool_result>`` message to it. So the
policy sees exactly what an agent sees in the benchmark, and a session's transcript is the engine's.
The multi-turn runner (``posttrain.rollout.multiturn``) keeps one training row per seat: the policy's
replies are trained on, the engine's messages are attended but not trained on.

Rewards:

* session reward: the case's success rate S = (1/N) Σ_i 1[agent i submitted the right answer]
  (arXiv 2603.01045 §3.3; the case is solved when S = 1; correctness by the engine's scoring:
  ``scoring: default`` posttrain's, ``paper`` the authors'), or with ``partial_credit: true`` the
  partial correctness P = (1/N) Σ_i q_i (level I: within 1 %; II: matching positions; III: LIS);
* turn criteria (every seat, every round; 0 fine, −1 violated; for DuCA's turn horizon):
  ``format``: the reply holds no parseable tool call (the engine answers with its corrective
  message); ``protocol``: a call the protocol answered with an error (unknown tool, missing or bad
  parameter, bad target, a shared-file key not (yet) written), or an answer submitted before the agent
  received anything from another agent while N > 1 (a message, or another agent's file it read: the
  protocol's own ``received`` count; a submission that cannot have used the others' data).

``metrics()`` per session (averaged per session by the runner, logged each step): ``silo_success``
(S), ``silo_solved`` (1 when S = 1), ``silo_partial`` (P), ``silo_submitted`` (share of agents that submitted), ``silo_valid_calls``
(share of replies with a parseable call and no refused call), ``silo_messages_per_agent`` (the
protocol's message count / N), ``silo_rounds``.

Design notes (posttrain's, no paper gives them): a session cut at the runner's context cap is scored
as the benchmark would score it at that point (non-submitters count as wrong), so its reward is S or
P of the partial case; the ``reminder`` scaffold is refused (it edits a message the policy already
read), ``planning`` / ``scratchpad`` are accepted (they change only the opening).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

from posttrain.envs.base import MultiAgentEnv, SeatsResult, StepResult, register_env
from posttrain.tasks.base import Example, Task, register_task
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.benchmarks.silo.engine import CaseRun, EngineConfig, SiloEngine

CRITERIA = ("format", "protocol")


def _refused(result: Any) -> bool:
    return isinstance(result, dict) and ("error" in result or result.get("success") is False)


@register_env("silo")
class SiloEnv(MultiAgentEnv):
    """A SILO-BENCH case with every seat played by the policy (module docstring). The example's
    ``meta["case"]`` is the case (as `generate_case` / `load_case` give it) and ``meta["protocol"]``
    its protocol (``protocol`` here is the default for examples without one)."""

    criteria = CRITERIA

    def __init__(
        self,
        max_rounds: int = 8,
        protocol: str = "p2p",
        scoring: str = "default",
        partial_credit: bool = False,
        prompt_set: str = "code",
        scaffolds: list[str] | tuple[str, ...] = (),
    ) -> None:
        if "reminder" in scaffolds:
            raise InvalidValueError(
                "environment 'silo': the 'reminder' scaffold edits the last message before each round, "
                "after the policy has read it; use 'planning' or 'scratchpad'"
            )
        self.cfg = EngineConfig(
            max_rounds=max_rounds, prompt_set=prompt_set, scaffolds=tuple(scaffolds), scoring=scoring
        )
        self.max_turns = max_rounds
        self.protocol = protocol
        self.partial_credit = bool(partial_credit)
        self.state: CaseRun | None = None
        self._valid = self._replies = 0
        self._result: Any = None

    # ----------------------------------------------------------------------------------- session
    def reset_seats(self, example: Any, seed: int) -> list[list[dict[str, Any]]]:
        meta = getattr(example, "meta", None) or {}
        case = meta.get("case")
        if not isinstance(case, dict):
            raise InvalidValueError(
                f"environment 'silo': example {getattr(example, 'id', example)!r} has no meta['case'] "
                "(use the task 'silo', or put a SILO-BENCH case there)"
            )
        engine = SiloEngine(case, str(meta.get("protocol") or self.protocol), None, self.cfg)
        self.state = engine.start()
        self._valid = self._replies = 0
        self._result = None
        return [self.state.messages(i) for i in range(engine.n)]

    def step_seats(self, texts: Mapping[int, str]) -> SeatsResult:
        st = self.state
        if st is None:
            raise InvalidValueError("environment 'silo': step_seats before reset_seats")
        active = st.begin_round()
        if sorted(texts) != active:
            raise InvalidValueError(
                f"environment 'silo', round {st.round}: replies for seats {sorted(texts)}, but seats "
                f"{active} act in this round"
            )
        seats: dict[int, StepResult] = {}
        n = st.engine.n
        for i in active:  # in agent order, as the engine applies them
            rec = st.apply(i, texts[i])
            no_call = not rec["calls"]
            refused = any(_refused(r["result"]) for r in rec["results"] if r["tool"] != "system")
            # the protocol counts what agent i received (messages, other agents' files it read)
            premature = rec["submitted"] and n > 1 and st.proto.received[i] == 0
            self._replies += 1
            self._valid += int(not no_call and not refused)
            seats[i] = StepResult(
                observation=st.contexts[i][-1]["content"],
                turn_rewards={
                    "format": -1.0 if no_call else 0.0,
                    "protocol": -1.0 if (refused or premature) else 0.0,
                },
                done=bool(st.submitted[i]),
                info={"calls": rec["calls"]},
            )
        st.end_round()
        if not st.finished:
            return SeatsResult(seats)
        return SeatsResult(seats, done=True, session_reward=self._reward())

    def _score(self) -> Any:
        if self._result is None and self.state is not None:
            self._result = self.state.result()
        return self._result

    def _reward(self) -> float:
        m = self._score().metrics
        return float(m["P_partial_correctness"] if self.partial_credit else m["S_success_rate"])

    def abort(self) -> float:
        return self._reward() if self.state is not None else 0.0

    # ----------------------------------------------------------------------------------- reports
    def metrics(self) -> dict[str, float]:
        res = self._score()
        if res is None:
            return {}
        n = res.num_agents
        return {
            "silo_success": float(res.metrics["S_success_rate"]),
            "silo_solved": float(res.success),
            "silo_partial": float(res.metrics["P_partial_correctness"]),
            "silo_submitted": sum(r is not None for r in res.submit_rounds) / n,
            "silo_valid_calls": self._valid / max(self._replies, 1),
            "silo_messages_per_agent": res.message_counts.get("code", 0) / n,
            "silo_rounds": float(res.rounds_executed),
        }

    def summary(self) -> dict[str, Any]:
        res = self._score()
        if res is None:
            return {}
        return {
            "case_id": res.case_id,
            "protocol": res.protocol,
            "num_agents": res.num_agents,
            "success": bool(res.success),
            "answers": res.answers,
            "failure_modes": res.failure_modes,
        }

    def case_result(self) -> Any:
        """The finished case's :class:`~posttrain_lab.benchmarks.silo.engine.CaseResult` (the
        benchmark's own record: metrics, failure modes, transcript)."""
        return self._score()


# -------------------------------------------------------------------------------------- the task
@register_task("silo")
class SiloTask(Task):
    """SILO-BENCH cases as RL examples (``meta["case"]``, ``meta["protocol"]``; the prompt is the case
    id: the environment gives each seat its own opening).

    ``train``: ``n_train`` cases of each (task in ``tasks``, N in ``agents``, protocol in
    ``protocols``), generated from seeds ``seed, seed + 1, ...``; ``heldout``: ``n_heldout`` cases of
    the same combinations from seeds that never appear in train (``seed + 10_000 + k``); ``ood``:
    ``n_heldout`` cases of each (task in ``heldout_tasks``, N in ``heldout_agents``, protocol), tasks
    and agent counts never trained on (empty lists give an empty split)."""

    name = "silo"
    default_reward = "exact_match"  # unused: the environment scores the episodes
    splits = ("train", "heldout", "ood")

    def __init__(
        self,
        tasks: list[str] | tuple[str, ...] = ("I-01", "I-06"),
        agents: list[int] | tuple[int, ...] = (2,),
        protocols: list[str] | tuple[str, ...] = ("p2p",),
        n_train: int = 32,
        n_heldout: int = 8,
        heldout_tasks: list[str] | tuple[str, ...] = (),
        heldout_agents: list[int] | tuple[int, ...] = (),
        seed: int = 0,
    ) -> None:
        super().__init__()
        from posttrain_lab.benchmarks.silo import TASK_IDS
        from posttrain_lab.benchmarks.silo.protocols import canonical_protocol

        for t in (*tasks, *heldout_tasks):
            if t not in TASK_IDS:
                raise InvalidValueError(
                    f"task 'silo': unknown SILO-BENCH task {t!r}; known: {', '.join(TASK_IDS)}"
                )
        for n in (*agents, *heldout_agents):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidValueError(f"task 'silo': agent counts must be ints >= 1, got {n!r}")
        if not tasks or not agents or not protocols:
            raise InvalidValueError("task 'silo': tasks, agents and protocols must be non-empty")
        if n_train < 1 or n_heldout < 0:
            raise InvalidValueError(
                f"task 'silo': n_train >= 1 and n_heldout >= 0, got {n_train}, {n_heldout}"
            )
        self.tasks, self.agents = list(tasks), [int(n) for n in agents]
        self.protocols = [canonical_protocol(p) for p in protocols]
        self.heldout_tasks, self.heldout_agents = list(heldout_tasks), [int(n) for n in heldout_agents]
        self.n_train, self.n_heldout, self.seed = n_train, n_heldout, seed

    def params(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "agents": self.agents,
            "protocols": self.protocols,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "heldout_tasks": self.heldout_tasks,
            "heldout_agents": self.heldout_agents,
            "seed": self.seed,
        }

    @staticmethod
    def _examples(
        tasks: list[str], agents: list[int], protocols: list[str], seeds: list[int]
    ) -> list[Example]:
        from posttrain_lab.benchmarks.silo import generate_case

        out = []
        for t in tasks:
            for n in agents:
                for p in protocols:
                    for s in seeds:
                        case = generate_case(t, n, s)
                        cid = f"{t}_n{n}_{p}_s{s}"
                        out.append(Example(cid, cid, "", {"case": case, "protocol": p, "task_id": t, "n": n}))
        return out

    def _build_splits(self) -> dict[str, list[Example]]:
        train = self._examples(
            self.tasks, self.agents, self.protocols, [self.seed + k for k in range(self.n_train)]
        )
        held_seeds = [self.seed + 10_000 + k for k in range(self.n_heldout)]
        heldout = self._examples(self.tasks, self.agents, self.protocols, held_seeds)
        ood_tasks = self.heldout_tasks or self.tasks
        ood_agents = self.heldout_agents or self.agents
        ood = (
            self._examples(ood_tasks, ood_agents, self.protocols, held_seeds)
            if (self.heldout_tasks or self.heldout_agents)
            else []
        )
        random.Random(self.seed).shuffle(train)  # prompts_per_step draws a mix of tasks and N
        return {"train": train, "heldout": heldout, "ood": ood}


def scripted_conversations(
    case: dict[str, Any], protocol: str, cfg: EngineConfig | None = None
) -> tuple[list[list[dict[str, str]]], Any]:
    """Every seat's full chat (opening, replies, tool results) when the scripted reference agents
    play ``case``, and the case's result: the SFT rows of the warm start (issue 39 item 2)."""
    from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
    from posttrain_lab.benchmarks.silo.agents.base import reply_as

    eng = SiloEngine(case, protocol, ScriptedAgent(), cfg)
    st = eng.start()

    async def play() -> None:
        while not st.finished:
            active = st.begin_round()
            replies = await asyncio.gather(
                *(reply_as(eng.agents[i], eng.seats[i], st.messages(i)) for i in active)
            )
            for i, rep in zip(active, replies, strict=True):
                st.apply(i, rep.text, rep.usage)
            st.end_round()

    asyncio.run(play())
    return [list(c) for c in st.contexts], st.result()


__all__ = ["CRITERIA", "SiloEnv", "SiloTask", "scripted_conversations"]
