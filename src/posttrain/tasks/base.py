"""The task interface: `Example`, `Task`, and the task registry.

A task is a seeded, deterministic source of prompts with gold answers, split into a `train` and a
`heldout` split that never share a question. A task may declare further splits in `Task.splits`
from `OPTIONAL_SPLITS` (e.g. `ood`: an out-of-domain test set, `dialogue-events`). Rewards
(`posttrain.rewards`) score a completion
against an `Example`; the task names its default reward by registry name (`Task.default_reward`),
so the tasks layer never imports the rewards layer.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry

SplitName = Literal["train", "heldout", "ood"]
SPLITS: tuple[str, ...] = ("train", "heldout")  # every task has these
OPTIONAL_SPLITS: tuple[str, ...] = ("ood",)  # out-of-domain test split of tasks that declare it

# The marker after which a completion's final answer is read (GSM8K convention). Tasks put the
# marker they use into `Example.meta["answer_marker"]`; rewards read it from there.
DEFAULT_MARKER = "####"


@dataclass(frozen=True)
class Example:
    """One prompt with its gold answer.

    `id` is stable and unique within a task + split; `prompt` is raw text (chat templating is the
    rollout's job); `answer` is the canonical gold answer string; `meta` holds whatever a verifier
    needs (e.g. countdown `numbers`/`target`, the `answer_marker`). `meta` is excluded from the hash
    (dicts are unhashable) but included in equality.
    """

    id: str
    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)


class ChatPrompt(str):
    """A prompt that is a conversation (TRL's conversational ``prompt``, verl's ``prompt`` column):
    a ``str`` (the text shown in logs and used to deduplicate: the last user message alone, or
    ``role: content`` lines) that carries its ``messages``. The rollout's prompt formatter renders
    ``messages`` with the tokenizer's chat template (``task.prompt_template`` wraps the last user
    message), so system prompts and earlier turns reach the model as written."""

    messages: tuple[tuple[str, str], ...]

    def __new__(cls, messages: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> ChatPrompt:
        msgs = tuple((str(r), str(c)) for r, c in messages)
        text = msgs[0][1] if len(msgs) == 1 else "\n".join(f"{r}: {c}" for r, c in msgs)
        obj = super().__new__(cls, text)
        obj.messages = msgs
        return obj

    def __reduce__(self) -> Any:  # pickles (reward workers) as a ChatPrompt, not a plain str
        return (ChatPrompt, (self.messages,))


def message_pairs(value: Any, where: str, error: type[Exception] = ValueError) -> list[tuple[str, str]]:
    """A non-empty list of ``{"role", "content"}`` objects -> ``[(role, content), ...]``; anything else
    raises ``error`` naming ``where`` and the message index."""
    if not isinstance(value, list) or not value:
        raise error(f"{where}: expected a non-empty list of {{'role', 'content'}} messages")
    out = []
    for j, m in enumerate(value):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise error(
                f"{where}[{j}]: expected an object with string 'role' and 'content', got {str(m)[:60]!r}"
            )
        out.append((m["role"], m["content"]))
    return out


def chat_prompt(value: Any, where: str, error: type[Exception] = ValueError) -> ChatPrompt:
    """A list of ``{"role", "content"}`` objects ending in a user turn -> :class:`ChatPrompt`;
    anything else raises ``error`` naming ``where`` and the message index."""
    if not value:
        raise error(f"{where}: an empty conversation (expected a list of {{'role', 'content'}} objects)")
    out = message_pairs(value, where, error)
    if out[-1][0] != "user":
        raise error(
            f"{where}: the conversation ends with a {out[-1][0]!r} message; a prompt must end with a user "
            "message (the model answers it)"
        )
    return ChatPrompt(out)


class Task:
    """Base class for tasks. Subclasses set `name` and `default_reward`, implement `_build_split`.

    `split(name)` is seeded and deterministic, and the two splits are disjoint (no heldout question
    appears in train). Splits are built once and cached; callers get a fresh list each time.
    """

    name: str = ""
    default_reward: str = "exact_match"
    #: A completion length that fits this task's answers, or None: ``posttrain eval --task NAME``
    #: generates this many tokens when neither ``--max-new-tokens`` nor ``rollout.max_new_tokens``
    #: says otherwise (the general default of 16 truncated 93 % of IFBench's answers).
    max_new_tokens: int | None = None
    #: The split names this task has: ``SPLITS`` plus any of ``OPTIONAL_SPLITS`` it builds.
    splits: tuple[str, ...] = SPLITS

    def __init__(self) -> None:
        self._splits: dict[str, list[Example]] = {}

    def split(self, name: SplitName) -> list[Example]:
        if name not in self.splits:
            raise InvalidValueError(
                f"task {self.name!r}: unknown split {name!r}; accepted: {', '.join(self.splits)}"
            )
        if name not in self._splits:
            self._splits.update(self._build_splits())
        return list(self._splits[name])

    def _build_splits(self) -> dict[str, list[Example]]:
        raise NotImplementedError

    def reference_completion(self, example: Example, style: Literal["short", "long"] = "short") -> str:
        """A completion that the task's default reward scores 1.0 (used to build SFT targets)."""
        raise NotImplementedError(f"task {self.name!r} has no reference completions")

    def params(self) -> dict[str, Any]:
        """The constructor parameters of this task (for logs and run configs)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Name, default reward, parameters and split sizes."""
        return {
            "name": self.name,
            "default_reward": self.default_reward,
            "params": self.params(),
            "sizes": {s: len(self.split(s)) for s in self.splits},  # type: ignore[arg-type]
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


TASKS: Registry[type[Task]] = Registry("task", group="posttrain.tasks")


def register_task(name: str, *, aliases: tuple[str, ...] = ()):
    """Class decorator: `@register_task("arithmetic")` makes `get_task("arithmetic", ...)` work."""
    return TASKS.register(name, aliases=aliases)


def check_params(kind: str, name: str, cls: type, params: dict[str, Any]) -> None:
    """Reject keyword parameters that `cls.__init__` does not accept, naming the accepted ones."""
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in sig.parameters if p != "self"]
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    unknown = [k for k in params if k not in accepted]
    if unknown:
        raise InvalidValueError(
            f"{kind} {name!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )


def check_split_sizes(task: str, **sizes: Any) -> None:
    """Each of `sizes` (e.g. `n_train=..., n_heldout=...`) must be a non-negative int (not a bool)."""
    for key, val in sizes.items():
        if not isinstance(val, int) or isinstance(val, bool) or val < 0:
            raise InvalidValueError(f"task {task!r}: {key} must be a non-negative integer, got {val!r}")


def get_task(name: str, **params: Any) -> Task:
    """Build a registered task: `get_task("arithmetic", digits=3, seed=1)`."""
    cls = TASKS.get(name)
    check_params("task", name, cls, params)
    return cls(**params)


def list_tasks() -> list[str]:
    return TASKS.names()
