"""Multi-turn episodes: G conversations per scenario between the policy and an environment.

:class:`MultiTurnRunner` (registered as ``multi-turn``) plays every conversation of a step turn by
turn. At each turn the contexts of ALL active conversations (every scenario, every group member) go
to the engine in one ``engine.generate`` call; each sampled turn is decoded and handed to its own
:class:`~posttrain.envs.Env` instance, whose reply is tokenised and appended. A row of the returned
:class:`~posttrain.rollout.RolloutBatch` is one whole conversation after the prompt::

    completion = [agent turn 1][env reply 1][agent turn 2][env reply 2] ... [agent turn K]
    completion_mask  1 on all of them (the policy attends to the environment's replies)
    action_mask      1 on the agent turns only (the only tokens with loss, KL, entropy, metrics)
    logprobs         the engine's sampling log-probs on every agent token (0 on environment tokens)

Rendering: with the plain template (``task.chat_template: false``, the presets) the prompt is the
formatted example prompt followed by ``user_turn`` with the first observation, and each reply is
``user_turn`` again (default ``"\\nUser: {observation}\\nAgent:"``). With the model's chat template the
prompt is ``[system: example prompt, user: first observation]`` with the generation prompt, and each
reply is exactly the text the chat template puts after the agent's turn (end-of-turn, the user
message, the next generation prompt). An agent turn cut by ``max_new_tokens`` (no EOS sampled) gets
an EOS appended as an environment token, so every turn ends the way the template expects. Because
that EOS is not the policy's, a cut turn would otherwise cost nothing: ``cut_violation`` (default
``"auto"`` = the environment's ``format`` criterion when it has one; a criterion name; or null for
the behaviour before the 2026-12-01 fixes) marks every cut turn as violating that criterion (−1).

Context cap: a conversation whose context (prompt + completion) plus the next turn's
``max_new_tokens`` would exceed ``max_context`` is cut before that turn: its row gets finish reason
``"length"`` (``RolloutBatch.truncated``, the trainer's ``truncated_frac``) and the environment's
:meth:`~posttrain.envs.Env.abort` session reward. Never silent.

Rewards (``Episodes.rewards``, what the loop's shaper and a standard estimator such as ``grpo`` see):
``reward="session"`` the session reward R_i; ``reward="sum"`` R_i + Σ_k Σ_c r_{i,k,c} (session plus
every turn criterion of every turn). With ``turn_inputs=true`` the runner also passes, as
``advantage_inputs`` (they follow their rows through group filtering):

* ``turn_index`` (N, T) long: 1-based turn k of each agent token, 0 on environment tokens / padding;
* ``turn_rewards`` (N, max_turns, C) float: the C named criteria of each turn (0 beyond the last);
* ``num_turns`` (N,) long.

``duca`` (:func:`posttrain.algos.advantages.duca`) consumes them; estimators that take only outcome
rewards (``grpo``) need ``turn_inputs=false``.

Tools (``tools``: registered names, ``package.module:function`` or mappings with their own
``timeout_s`` / ``sandbox``; ``tool_timeout_s`` / ``tool_sandbox`` set every tool's; :mod:`posttrain.tools`)
are a layer in front of the environment, :class:`~posttrain.rollout.tool_use.ToolUse`: the tool schemas
go to the chat template (``apply_chat_template(tools=...)``) when it speaks a tool format
(``tool_format: auto`` reads it: ``hermes`` for Qwen2.5/Qwen3, ``llama3``), else posttrain's
``fallback`` (tool descriptions in the system message, results as a ``<tool_response>`` user turn;
:mod:`posttrain.tools.calls`). An agent turn that contains calls is not sent to the environment: each
call runs under its deadline (the ``python`` tool in its sandbox), a malformed call, a bad argument or
a call past its deadline comes back as a tool error (never a crash, never a hang), the results are
appended as tool turns (environment tokens: attended, never trained on) and the agent continues the
same turn (its tokens keep the turn's index). A conversation makes at most ``max_tool_calls`` calls;
once they are spent, a turn with calls goes to the environment as the agent's message, unexecuted.
``Episodes.row_stats`` counts ``tool_calls``, ``tool_valid_calls`` (well-formed, a known tool, arguments
accepted and the tool did not raise; an error message the tool returns, such as the calculator's
"division by zero", is a valid call's answer) and ``tool_timeouts`` per conversation; the RL loop logs
``tool_call_rate`` (share of conversations with a call), ``tool_valid_rate`` (valid / all calls; 0 when
no call was made), ``tool_calls_mean`` and ``tool_timeouts``.

The loop itself knows only "active conversations -> one batched generate -> each conversation's answer":
rendering is a :class:`~posttrain.rollout.render.Renderer` (plain, chat, chat with native tools), tool
calls are answered by :class:`~posttrain.rollout.tool_use.ToolUse` without advancing the turn, and the
seats of a multi-agent environment step together through :class:`Seats`.

Several agents (a :class:`~posttrain.envs.MultiAgentEnv`, e.g. the lab's ``silo``): one policy plays
every seat. Each seat's conversation is its own row (its opening messages from ``reset_seats``, its
turns, the environment's replies to it as environment tokens); the seats of a session share its group
id (a GRPO group holds every seat of the ``group_size`` sessions of a scenario) and its session reward.
All seats of all sessions that still act are generated in one batched call per round; a seat the
environment reports done stops generating while the others go on. A session whose seat would exceed
``max_context`` is cut as a whole (every seat's row: finish reason ``"length"``, reward ``abort()``).
``Episodes.row_stats`` carries ``episode_weight`` (1 / seats) and the environment's ``metrics()`` per
row, so :meth:`~MultiTurnRunner.step_metrics` averages them per session (the lab's ``silo_success``).
Tools of the runner (``tools``) are for single-seat environments; a multi-agent environment brings
its own.

Token-exact: the training row IS the token sequence the engine extended, turn after turn; the tokens
between two agent turns are rendered from the template by appending the new messages to a fixed
stand-in conversation and taking what follows the stand-in agent turn and its EOS, so a template that
re-renders earlier turns differently (Qwen3 drops earlier ``<think>`` blocks) cannot change tokens
that were generated.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from posttrain.envs import ENVS, Env, MultiAgentEnv, StepResult, check_seats, check_step, env_factory
from posttrain.rollout.base import FINISH_LENGTH, FINISH_STOP, RolloutBatch, RolloutEngine, SamplingParams
from posttrain.rollout.episodes import EpisodeRunner, Episodes, PromptFormatter
from posttrain.rollout.render import Renderer, make_renderer
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

if TYPE_CHECKING:  # the tools load only when a runner uses them (importing rollout stays light)
    from posttrain.rollout.tool_use import ToolUse
    from posttrain.tools import ToolResult

REWARD_MODES = ("session", "sum")


@dataclass(frozen=True)
class MultiTurnSettings:
    """The multi-turn runner's parameters (``rollout.runner.params``), checked when built.

    ``env`` / ``env_params``: the environment (``posttrain.envs.ENVS`` name or import path);
    ``max_context``: cap on prompt + conversation tokens; ``reward``: what ``Episodes.rewards`` holds
    ("session" or "sum"); ``turn_inputs``: pass the per-turn advantage inputs; ``user_turn``: the
    plain-template rendering of an observation; ``seed``: seeds the environments (session j of example
    i in the c-th ``run`` call gets a seed derived from (seed, c, example id, j)); ``transcripts``: how
    many conversations ``eval_metrics`` returns verbatim; ``cut_violation``: the criterion a turn cut at
    the token cap violates (module docstring); ``system``: the example's prompt as the system message
    (false: the first observation opens the conversation, as for the ``answer`` environment);
    ``tools`` / ``tool_format`` / ``max_tool_calls`` / ``tool_turn`` (the plain-template rendering of
    tool results) / ``tool_workers`` (calls run in parallel) / ``tool_timeout_s`` (every call's deadline;
    None: the tools' default, 10 s) / ``tool_sandbox`` (the ``python`` tool's backend: auto, bwrap,
    guard; None: auto): tool use (module docstring)."""

    env: str
    env_params: dict[str, Any] | None = None
    max_context: int = 2048
    reward: Literal["session", "sum"] = "session"
    turn_inputs: bool = True
    user_turn: str = "\nUser: {observation}\nAgent:"
    seed: int = 0
    transcripts: int = 3
    cut_violation: str | None = "auto"
    system: bool = True
    tools: list[Any] | None = None
    tool_format: str = "auto"
    max_tool_calls: int = 4
    tool_turn: str = "\nTool: {observation}\nAgent:"
    tool_workers: int = 4
    tool_timeout_s: float | None = None
    tool_sandbox: str | None = None

    def __post_init__(self) -> None:
        if self.reward not in REWARD_MODES:
            raise InvalidValueError(
                f"runner 'multi-turn': reward must be one of {list(REWARD_MODES)}, got {self.reward!r}"
            )
        m = self.max_context
        if isinstance(m, bool) or not isinstance(m, int) or m < 2:
            raise InvalidValueError(f"runner 'multi-turn': max_context must be an int >= 2, got {m!r}")
        if "{observation}" not in self.user_turn:
            raise InvalidValueError(
                f"runner 'multi-turn': user_turn must contain '{{observation}}', got {self.user_turn!r}"
            )
        for key, val, low in (
            ("max_tool_calls", self.max_tool_calls, 0),
            ("tool_workers", self.tool_workers, 1),
        ):
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise InvalidValueError(f"runner 'multi-turn': {key} must be an int >= {low}, got {val!r}")
        if "{observation}" not in self.tool_turn:
            raise InvalidValueError(
                f"runner 'multi-turn': tool_turn must contain '{{observation}}', got {self.tool_turn!r}"
            )


@dataclass
class Session:
    """One conversation being played (what the runner records per row)."""

    group: int
    example: Any
    env: Env
    seed: int
    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turn_rewards: list[list[float]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    session_reward: float | None = None
    done: bool = False
    truncated: bool = False
    turns_cut: int = 0
    turn: int = 1  # the environment turn the agent is in (tool rounds stay in it)
    turn_cut: bool = False  # a round of the current turn was cut at the token cap
    tool_calls: int = 0
    tool_valid: int = 0
    tool_timeouts: int = 0
    seat: int = 0  # a multi-agent environment's seat (0 for a single-seat environment)
    seats: int = 1  # how many seats its session has (rows of one session share its env)
    multi: bool = False  # its environment is a MultiAgentEnv (even with one seat)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.completion

    def transcript(self) -> dict[str, Any]:
        return {
            "example_id": getattr(self.example, "id", None),
            "seed": self.seed,
            "session_reward": self.session_reward,
            "truncated": self.truncated,
            "turns": len(self.turn_rewards),
            "summary": self.env.summary(),
            **({"seat": self.seat, "seats": self.seats} if self.multi else {}),
            "messages": self.messages,
        }

    def append_env(self, ids: list[int]) -> None:
        """Environment tokens: attended, never trained on (action 0, log-prob 0, turn index 0)."""
        self.completion += ids
        self.actions += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turn_index += [0] * len(ids)


class Seats:
    """The adapter of a :class:`~posttrain.envs.MultiAgentEnv`: one row per seat of a session (its
    opening messages from ``reset_seats``), every acting seat's turn stepped together
    (``step_seats``), a session cut as a whole when one seat reaches the context cap."""

    def __init__(self, runner: MultiTurnRunner) -> None:
        self.runner = runner

    def open(self, group: int, example: Any, env: MultiAgentEnv, seed: int) -> list[Session]:
        opening = env.reset_seats(example, seed)
        return [
            Session(
                group,
                example,
                env,
                seed,
                self.runner.renderer.opening(msgs),
                messages=[dict(m) for m in msgs],
                seat=seat,
                seats=len(opening),
                multi=True,
            )
            for seat, msgs in enumerate(opening)
        ]

    def round(self, sessions: list[Session], turns: list[tuple[Session, str, bool]]) -> None:
        """One round of a multi-agent session: every acting seat's turn goes to ``step_seats`` together."""
        env = turns[0][0].env
        rnd = turns[0][0].turn
        texts = {s.seat: text for s, text, _ in turns}
        res = check_seats(env, env.step_seats(texts), texts, rnd)
        for s, text, cut in turns:
            r = res.seats[s.seat]
            self.runner._end_turn(s, text, r, cut)
            if r.done or res.done:
                s.done = True
                if r.observation:
                    s.messages.append({"role": "user", "content": r.observation, "final": True})
                continue
            s.messages.append({"role": "user", "content": r.observation})
            s.append_env(self.runner.renderer.reply(r.observation))
        if res.done:
            for s in sessions:
                if s.env is env:
                    s.done, s.session_reward = True, float(res.session_reward)

    @staticmethod
    def cut(sessions: list[Session], env: Env) -> None:
        """A multi-agent session one of whose seats reached the context cap: every seat's row ends."""
        reward = float(env.abort())
        for s in sessions:
            if s.env is env:
                s.done, s.truncated, s.session_reward = True, True, reward


class MultiTurnRunner(EpisodeRunner):
    """Runs ``n_per_prompt[i]`` conversations of example i against fresh environments (module
    docstring); ``params`` are :class:`MultiTurnSettings`' fields."""

    def __init__(self, engine: RolloutEngine, formatter: PromptFormatter, **params: Any) -> None:
        cfg = self.settings = MultiTurnSettings(**params)
        self.engine = engine
        self.formatter = formatter
        self.tokenizer = formatter.tokenizer
        self.system = cfg.system
        self.tool_use: ToolUse | None = None
        if cfg.tools:
            from posttrain.rollout.tool_use import ToolUse

            template = getattr(self.tokenizer, "chat_template", None) if formatter.chat else None
            self.tool_use = ToolUse(
                cfg.tools,
                chat_template=template,
                tool_format=cfg.tool_format,
                max_calls=cfg.max_tool_calls,
                workers=cfg.tool_workers,
                timeout_s=cfg.tool_timeout_s,
                sandbox=cfg.tool_sandbox,
            )
        tu = self.tool_use
        self.tools = tu.tools if tu else {}
        self.tool_schemas = tu.schemas if tu else []
        self.tool_format = tu.format if tu else "none"
        self.native_tools = bool(tu and tu.native)  # the template renders them
        self.max_tool_calls = cfg.max_tool_calls if tu else 0
        self.renderer: Renderer = make_renderer(
            formatter,
            user_turn=cfg.user_turn,
            tool_turn=cfg.tool_turn,
            tool_schemas=self.tool_schemas if self.native_tools else None,
        )
        self.make_env = env_factory(cfg.env, cfg.env_params)
        probe = self.make_env()
        self.multi = isinstance(probe, MultiAgentEnv)
        if self.multi and self.tools:
            raise InvalidValueError(
                f"runner 'multi-turn': environment {cfg.env!r} has several seats and brings its own tools; "
                "rollout.runner.params.tools is for single-seat environments"
            )
        self.seats = Seats(self)
        self.criteria: tuple[str, ...] = tuple(probe.criteria)
        self.max_turns = int(probe.max_turns)
        cut_violation = cfg.cut_violation
        if cut_violation == "auto":
            cut_violation = "format" if "format" in self.criteria else None
        if cut_violation is not None and cut_violation not in self.criteria:
            raise InvalidValueError(
                f"runner 'multi-turn': cut_violation {cut_violation!r} is not a criterion of environment "
                f"{cfg.env!r} (criteria: {list(self.criteria)}); use one of them, 'auto' or null"
            )
        self.cut_violation = cut_violation
        self.max_context, self.reward, self.turn_inputs = cfg.max_context, cfg.reward, cfg.turn_inputs
        self.seed, self.n_transcripts = cfg.seed, cfg.transcripts
        self._calls = 0
        self.last_sessions: list[Session] = []
        self._last: Episodes | None = None

    # ------------------------------------------------------------------------------- opening
    def _prompt(self, example: Any, first_obs: str) -> tuple[list[int], list[dict[str, Any]]]:
        system = self.formatter.text(example.prompt) if self.system else ""
        if (
            self.tool_use is not None and not self.native_tools
        ):  # fallback: tools described in the system message
            system = "\n\n".join(x for x in (system, self.tool_use.instructions()) if x)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": first_obs})
        return self.renderer.opening(messages), messages

    def _env_seed(self, example: Any, j: int) -> int:
        key = f"{self.seed}:{self._calls}:{getattr(example, 'id', '')}:{j}"
        return random.Random(key).getrandbits(31)

    def _open(self, examples: list[Any], n_per_prompt: list[int]) -> list[Session]:
        sessions: list[Session] = []
        for g, (ex, n) in enumerate(zip(examples, n_per_prompt, strict=True)):
            for j in range(n):
                env = self.make_env()
                seed = self._env_seed(ex, j)
                if isinstance(env, MultiAgentEnv):
                    sessions += self.seats.open(g, ex, env, seed)
                    continue
                first = env.reset(ex, seed)
                prompt, messages = self._prompt(ex, first)
                sessions.append(Session(g, ex, env, seed, prompt, messages=messages))
        return sessions

    # ------------------------------------------------------------------------------------- run
    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes:
        if len(examples) != len(n_per_prompt):
            raise InvalidValueError(
                f"runner 'multi-turn': {len(examples)} examples but {len(n_per_prompt)} group sizes"
            )
        sessions = self._open(examples, n_per_prompt)
        self._calls += 1
        have_lp = params.logprobs
        # every round either ends an environment turn or spends at least one tool call
        for _round in range(self.max_turns + self.max_tool_calls):
            active = self._active(sessions, params.max_new_tokens)
            if not active:
                break
            b = self.engine.generate([s.context for s in active], [1] * len(active), params)
            have_lp = have_lp and b.logprobs is not None
            texts = self.tokenizer.batch_decode(b.completion_lists(), skip_special_tokens=True)
            cuts = [r == FINISH_LENGTH for r in b.finish_reasons]
            for j, (s, ids) in enumerate(zip(active, b.completion_lists(), strict=True)):
                lps = b.logprobs[j, : len(ids)].tolist() if b.logprobs is not None else [0.0] * len(ids)
                s.completion += ids
                s.actions += [1] * len(ids)
                s.logprobs += lps
                s.turn_index += [s.turn] * len(ids)
                s.turns_cut += int(cuts[j])
                s.turn_cut = s.turn_cut or cuts[j]
            self._answer(sessions, active, texts, cuts)
        for s in sessions:  # check_step guarantees done by max_turns; belt and braces
            if not s.done:
                raise PosttrainRuntimeError("runner 'multi-turn': a session neither ended nor was cut")
        self.last_sessions = sessions
        self._last = self._episodes(sessions, have_lp)
        return self._last

    def _active(self, sessions: list[Session], max_new_tokens: int) -> list[Session]:
        """The conversations that generate this round; one whose context cannot hold another
        ``max_new_tokens`` is cut first (a multi-agent session as a whole)."""
        for s in sessions:
            if not s.done and len(s.context) + max_new_tokens > self.max_context:
                if s.multi:
                    self.seats.cut(sessions, s.env)
                else:
                    s.done, s.truncated, s.session_reward = True, True, float(s.env.abort())
        return [s for s in sessions if not s.done]

    def _answer(
        self, sessions: list[Session], active: list[Session], texts: list[str], cuts: list[bool]
    ) -> None:
        """Each generated turn's answer: tool results (the turn goes on), the environment's step, or a
        multi-agent round of every seat of a session together."""
        tu = self.tool_use
        calls = [tu.calls(t, s.tool_calls) if tu else [] for s, t in zip(active, texts, strict=True)]
        results = tu.run(calls, [s.tool_calls for s in active]) if tu else [[] for _ in active]
        seated: dict[int, list[tuple[Session, str, bool]]] = {}
        for j, s in enumerate(active):
            if s.multi:
                seated.setdefault(id(s.env), []).append((s, texts[j], cuts[j]))
            elif calls[j]:
                self._tool_round(s, texts[j], calls[j], results[j], cuts[j])
            else:
                self._env_round(s, texts[j], cuts[j])
        for turns in seated.values():
            self.seats.round(sessions, turns)

    def _close_turn(self, s: Session, cut: bool) -> None:
        """A round the engine cut at the token cap (no EOS sampled) ends with an EOS (an environment
        token), as the template expects."""
        eos = self.tokenizer.eos_token_id
        if cut and eos is not None:
            s.append_env([int(eos)])

    def _tool_round(
        self, s: Session, text: str, calls: list[Any], results: list[tuple[str, ToolResult]], cut: bool
    ) -> None:
        """The tools answered the turn's calls: counted, recorded, rendered; the agent's turn goes on."""
        budget = self.max_tool_calls - s.tool_calls
        made = min(len(calls), budget)
        s.tool_calls += made
        s.tool_valid += sum(r.ok for _, r in results[:made])
        s.tool_timeouts += sum(r.timed_out for _, r in results[:made])
        s.messages += self.tool_use.messages(text, calls, results)
        self._close_turn(s, cut)
        s.append_env(self.renderer.tool_reply([(n, r.text) for n, r in results]))

    def _end_turn(self, s: Session, text: str, res: StepResult, cut: bool) -> None:
        """Record an agent turn the environment answered: its turn rewards (a turn cut at the token cap
        violates ``cut_violation``), the message, the closing EOS of a cut round; the next turn."""
        turn_r = dict(res.turn_rewards)
        if s.turn_cut and self.cut_violation is not None:  # the EOS closing it is not the policy's
            turn_r[self.cut_violation] = min(float(turn_r[self.cut_violation]), -1.0)
        s.turn_rewards.append([float(turn_r[c]) for c in self.criteria])
        s.messages.append({"role": "assistant", "content": text, "turn_rewards": turn_r})
        self._close_turn(s, cut)
        s.turn, s.turn_cut = s.turn + 1, False

    def _env_round(self, s: Session, text: str, cut: bool) -> None:
        res = check_step(s.env, s.env.step(text), s.turn)
        self._end_turn(s, text, res, cut)
        if res.done:
            s.done, s.session_reward = True, float(res.session_reward)
            if res.observation:
                s.messages.append({"role": "user", "content": res.observation, "final": True})
            return
        s.messages.append({"role": "user", "content": res.observation})
        s.append_env(self.renderer.reply(res.observation))

    def _episodes(self, sessions: list[Session], have_lp: bool) -> Episodes:
        batch = RolloutBatch.from_token_lists(
            [s.prompt for s in sessions],
            [s.completion for s in sessions],
            pad_token_id=self.engine.pad_token_id,
            group_ids=[s.group for s in sessions],
            finish_reasons=[FINISH_LENGTH if s.truncated else FINISH_STOP for s in sessions],
            actions=[s.actions for s in sessions],
            logprobs=[s.logprobs for s in sessions] if have_lp else None,
        )
        n, t, c = len(sessions), batch.completion_ids.shape[1], len(self.criteria)
        turn_r = torch.zeros(n, self.max_turns, c)
        turn_idx = torch.zeros(n, t, dtype=torch.long)
        for i, s in enumerate(sessions):
            if s.turn_rewards:
                turn_r[i, : len(s.turn_rewards)] = torch.tensor(s.turn_rewards)
            turn_idx[i, : len(s.turn_index)] = torch.tensor(s.turn_index, dtype=torch.long)
        sess = torch.tensor([float(s.session_reward) for s in sessions])
        rewards = sess if self.reward == "session" else sess + turn_r.sum(dim=(1, 2))
        inputs: dict[str, torch.Tensor] = {}
        if self.turn_inputs:
            num = torch.tensor([len(s.turn_rewards) for s in sessions], dtype=torch.long)
            inputs = {"turn_index": turn_idx, "turn_rewards": turn_r, "num_turns": num}
        texts = self.tokenizer.batch_decode([s.completion for s in sessions], skip_special_tokens=True)
        stats = {}
        if self.tools:
            stats = {
                "tool_calls": torch.tensor([float(s.tool_calls) for s in sessions]),
                "tool_valid_calls": torch.tensor([float(s.tool_valid) for s in sessions]),
                "tool_timeouts": torch.tensor([float(s.tool_timeouts) for s in sessions]),
            }
        if self.multi:  # per-session numbers on every seat's row, weighted 1 / seats (step_metrics)
            stats["episode_weight"] = torch.tensor([1.0 / s.seats for s in sessions])
            per = [s.env.metrics() for s in sessions]
            for key in sorted(set().union(*per)):
                stats[f"env:{key}"] = torch.tensor([float(m.get(key, 0.0)) for m in per])
        return Episodes(
            batch=batch,
            texts=list(texts),
            examples=[s.example for s in sessions],
            rewards=rewards,
            advantage_inputs=inputs,
            row_stats=stats,
        )

    def step_metrics(self, episodes: Episodes) -> dict[str, float]:
        """With tools: ``tool_call_rate`` (share of conversations with at least one call),
        ``tool_valid_rate`` (valid calls / calls, 0 without calls), ``tool_calls_mean`` and
        ``tool_timeouts`` (calls cut at their deadline, summed). With a multi-agent environment: each key
        of its ``metrics()`` averaged per session."""
        st = episodes.row_stats
        out: dict[str, float] = {}
        if "tool_calls" in st:
            calls, valid = st["tool_calls"], st["tool_valid_calls"]
            out.update(
                tool_call_rate=float((calls > 0).float().mean()) if len(calls) else 0.0,
                tool_valid_rate=float(valid.sum() / calls.sum().clamp(min=1.0)),
                tool_calls_mean=float(calls.mean()) if len(calls) else 0.0,
            )
            if "tool_timeouts" in st:
                out["tool_timeouts"] = float(st["tool_timeouts"].sum())
        if "episode_weight" in st and len(st["episode_weight"]):
            w = st["episode_weight"]
            for key in (k for k in st if k.startswith("env:")):
                out[key[4:]] = float((st[key] * w).sum() / w.sum())
        return out

    # ------------------------------------------------------------------------------ evaluation
    def eval_metrics(self, episodes: Episodes) -> dict[str, Any]:
        """Over the conversations of ``episodes`` (this runner's last run): ``session_reward_mean``,
        ``avg_turns``, ``truncated_rate``, the tool metrics of :meth:`step_metrics`, per criterion c ``<c>_rate`` (fraction of agent turns with a
        negative score) and ``<c>_session_rate`` (fraction of conversations with at least one), for
        every boolean fact of ``Env.summary()`` (sales: ``conversion``) ``<fact>_rate``, and
        ``transcripts``: the first ``transcripts`` conversations verbatim."""
        if episodes is not self._last:
            raise InvalidValueError(
                "runner 'multi-turn': eval_metrics() needs the Episodes of this runner's last run()"
            )
        ss = self.last_sessions
        n = max(len(ss), 1)
        turns = [len(s.turn_rewards) for s in ss]
        sessions = max(sum(1.0 / s.seats for s in ss), 1e-12)  # a multi-agent session's seats count once
        out: dict[str, Any] = {
            "session_reward_mean": sum(float(s.session_reward) / s.seats for s in ss) / sessions
            if ss
            else 0.0,
            "avg_turns": sum(turns) / n,
            "truncated_rate": sum(s.truncated for s in ss) / n,
            "turn_cut_rate": sum(s.turns_cut for s in ss) / max(sum(turns), 1),
        }
        for ci, c in enumerate(self.criteria):
            bad = [sum(tr[ci] < 0 for tr in s.turn_rewards) for s in ss]
            out[f"{c}_rate"] = sum(bad) / max(sum(turns), 1)
            out[f"{c}_session_rate"] = sum(b > 0 for b in bad) / n
        summaries = [s.env.summary() for s in ss]
        for key in summaries[0] if summaries else ():
            if all(isinstance(sm.get(key), bool) for sm in summaries):  # per session, as above
                out[f"{key}_rate"] = (
                    sum(sm[key] / s.seats for sm, s in zip(summaries, ss, strict=True)) / sessions
                )
        out.update(self.step_metrics(episodes))
        out["transcripts"] = [s.transcript() for s in ss[: self.n_transcripts]]
        return out


def multi_turn_runner(ctx: Any, **params: Any) -> MultiTurnRunner:
    """Registry factory (``rollout.runner: {name: multi-turn, params: {...}}``, the fields of
    :class:`MultiTurnSettings`): a :class:`MultiTurnRunner` over the context's engine and formatter; the
    environments are seeded from the run seed (``ctx.seed``, the evaluation seed when evaluating) unless
    ``seed`` is given. ``env`` has no default: the library ships the interface, environments come from
    packages (the lab's ``sales``)."""
    if params.get("env") is None:
        raise InvalidValueError(
            "runner 'multi-turn': set rollout.runner.params.env to an environment: a name registered in "
            f"posttrain.envs.ENVS ({', '.join(ENVS.names()) or 'none installed'}) or a package.module:Name"
        )
    if params.get("seed") is None:
        params["seed"] = ctx.seed
    return MultiTurnRunner(ctx.engine, ctx.formatter, **params)


# the settings' fields are the factory's parameters (config-time checks name them and their defaults)
multi_turn_runner.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if f.name in ("env", "seed") else f.default,
            )
            for f in dataclasses.fields(MultiTurnSettings)
        ),
    ]
)


__all__ = ["REWARD_MODES", "MultiTurnRunner", "MultiTurnSettings", "Seats", "Session", "multi_turn_runner"]
