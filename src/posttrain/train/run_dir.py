"""Run-folder safety: one place that decides whether a run may write into its folder.

Used by :meth:`RLTrainer.train`, :meth:`SFTTrainer.train`, the demo and the CLI (which calls the same
functions before loading any model, so a refusal costs nothing).

* **Fresh run into a folder that holds a previous run** (``metrics.jsonl``, ``checkpoints/``,
  ``config.yaml``, a saved ``model/``, ...): refused, naming ``--resume`` (continue it) and
  ``--overwrite`` (delete the previous run's files first), like ``overwrite_output_dir`` of
  Hugging Face's ``TrainingArguments``. Without this, a re-run truncated the old ``metrics.jsonl``,
  replaced ``config.yaml`` and left the old ``step_*`` next to the new ``latest``.
  ``--overwrite`` deletes only run files (:data:`RUN_ENTRIES` and sub-folders that are runs
  themselves); other files in the folder are left alone.
* **Resume with a changed config**: the new config is compared with the one saved in the checkpoint
  (``trainer_state.json``; ``config.yaml`` as a fallback). The diff is shown. Keys in
  :data:`HARMLESS_KEYS` (how long, how often to log / evaluate / save, speed knobs) may change
  (``steps`` only while the lr schedule does not depend on it: :func:`schedule_jump`);
  any other change (model, task, reward, rollout, objective, advantage, optimizer, KL, hooks, seed,
  update schedule) makes the resumed run a different experiment and is refused unless forced
  (``--allow-config-change``). With ``kl.coef > 0`` a changed ``model.name`` is refused even when
  forced: the KL reference is loaded from ``model.name``, so the penalty would silently switch to a
  different reference model. An accepted change keeps the old config as
  ``config.until-step_NNNNNN.yaml`` next to the new ``config.yaml``.
* **One run per folder at a time**: :func:`lock_run_dir` takes an exclusive lock
  (``fcntl.flock`` on ``<out_dir>/.posttrain.lock``, which records the holder's PID and command). The
  kernel drops the lock when the holder exits in any way (``kill -9`` included), so a lock file left
  by a dead process is stale and simply taken over. A second run on the same folder is refused with
  the holder's PID. Without it, two ``--overwrite`` runs started together deleted each other's
  checkpoints and interleaved their ``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from posttrain.utils.errors import PosttrainError, option
from posttrain.utils.io import atomic_write_text

RUN_ENTRIES = (
    "metrics.jsonl",
    "samples.jsonl",
    "config.yaml",
    "checkpoints",
    "model",
    "summary.json",
    "curves.png",
    "tensorboard",
    "wandb",
)
"""Files and folders a run writes; their presence means the folder holds a run."""

HARMLESS_KEYS = (
    "steps",
    "out_dir",
    "eval",
    "logging",
    "checkpoint",
    "threads",
    "model.device",
    "model.gradient_checkpointing",
    "reward.num_workers",
    "reward.timeout_s",
    "reward.max_failed_frac",
    "rollout.max_batch_size",
    "micro_batch_size",
    "logprob_chunk_size",
)
"""Config keys (and sections) a resumed run may change: they do not change what is trained."""


class RunDirError(PosttrainError, ValueError):
    """A run folder that this run may not write into as asked; the message says what to do."""


# ---------------------------------------------------------------------------------- run lock
LOCK_NAME = ".posttrain.lock"
_HELD: dict[str, list[Any]] = {}  # realpath -> [open lock file, reference count, created the folder]


class RunDirBusy(RunDirError):
    """Another live process holds the run folder's lock."""


def _lock_holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return "another process"
    info = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    pid = info.get("pid", "?")
    cmd = f", {info['cmd']!r}" if info.get("cmd") else ""
    since = f", since {info['started']}" if info.get("started") else ""
    return f"PID {pid}{cmd}{since}"


def _unwritable(run_dir: Path, e: OSError) -> RunDirError:
    """out_dir cannot be created or written (read-only, no permission, disk full): one line naming
    the folder, the file and the reason, before anything was loaded."""
    import errno

    code = errno.errorcode.get(e.errno or 0)
    why = f"{e.strerror or e}" + (f" ({code})" if code else "")
    at = f" ({e.filename})" if e.filename else ""
    return RunDirError(
        f"out_dir {run_dir} cannot be written: {why}{at}; a run writes its lock, config, metrics and "
        "checkpoints there: choose a writable out_dir, or fix the folder's permissions"
    )


def lock_run_dir(run_dir: str | os.PathLike) -> RunLock:
    """Take the exclusive lock of ``run_dir`` (created if missing) for this process; re-entrant in
    one process (the CLI and the trainer both take it). Raises :class:`RunDirBusy` naming the holder
    when another live process has it. Under ``torchrun`` only rank 0 locks (the others share its run).
    Use as a context manager, or call :meth:`RunLock.release`."""
    run_dir = Path(run_dir)
    key = os.path.realpath(run_dir)
    if os.environ.get("RANK", "0") != "0" or key in _HELD:
        if key in _HELD:
            _HELD[key][1] += 1
        return RunLock(key)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"out_dir {run_dir} is a file; expected a directory for the run")
    created = not run_dir.exists()
    path = run_dir / LOCK_NAME
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(run_dir, e) from e
    while True:
        try:
            f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the run lasts
        except OSError as e:
            raise _unwritable(run_dir, e) from e
        try:
            _try_lock(f)
        except BlockingIOError:
            f.close()
            raise RunDirBusy(
                f"{run_dir} is in use by another run ({_lock_holder(path)}); two runs writing one folder "
                "destroy each other's checkpoints and metrics. Wait for it to finish, stop it, or choose "
                "another out_dir"
            ) from None
        # the previous holder may have removed the file between our open and lock: lock the one on disk
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    f.seek(0)
    f.truncate()
    cmd = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
    f.write(f"pid={os.getpid()}\ncmd={cmd}\nstarted={time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    _HELD[key] = [f, 1, created]
    return RunLock(key)


def _try_lock(f: Any) -> None:
    """Non-blocking exclusive lock; BlockingIOError when another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: lock the first byte instead
        import msvcrt

        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            raise BlockingIOError from None
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


class RunLock:
    """A held run-folder lock (see :func:`lock_run_dir`); ``release()`` is idempotent."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        held = _HELD.get(self.key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[self.key]
        f, _, created = held
        path = Path(self.key) / LOCK_NAME
        with contextlib.suppress(OSError):  # removed while still held (a waiter re-checks the inode)
            path.unlink()
        f.close()
        if created:  # a run that wrote nothing leaves no empty folder behind
            with contextlib.suppress(OSError):
                Path(self.key).rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


# ----------------------------------------------------------------------------------- fresh runs
def previous_run(run_dir: str | os.PathLike) -> list[str]:
    """Names of the run files in ``run_dir`` (sub-folders that hold runs count, e.g. the demo's
    ``sft/`` and ``rl/``); empty when it holds no run."""
    p = Path(run_dir)
    if not p.is_dir():
        return []
    found = []
    for entry in sorted(p.iterdir()):
        if entry.name in RUN_ENTRIES or entry.name.startswith("config.until-step_"):
            found.append(entry.name)
        elif entry.is_dir() and any((entry / n).exists() for n in RUN_ENTRIES):
            found.append(entry.name + "/")
    return found


STEPLESS_ENTRIES = ("config.yaml", "metrics.jsonl", "tensorboard", "wandb")
"""What a run that failed before its first step leaves behind (with no step row in metrics.jsonl)."""


def stepless_run(run_dir: str | os.PathLike, found: list[str]) -> bool:
    """True when the run files ``found`` are those of a run that never completed a step (it failed
    while loading or in its first evaluation): nothing in them is worth keeping, so a fresh run may
    replace them without --overwrite (otherwise the advice loops: --resume finds no checkpoint)."""
    if not found or any(name not in STEPLESS_ENTRIES for name in found):
        return False
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file():
        import json

        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                return False  # not ours to judge: keep it
            if not isinstance(row, dict) or int(row.get("step", 0) or 0) >= 1:
                return False
    return True


def prepare_run_dir(
    run_dir: str | os.PathLike, *, overwrite: bool = False, resume: bool = False, can_resume: bool = True
) -> None:
    """Before a fresh run writes anything: refuse a folder holding a previous run, or clear its run
    files when ``overwrite``. ``resume=True`` is checked by :func:`check_resume` instead."""
    if resume and overwrite:
        raise RunDirError(
            f"{option('resume')} and {option('overwrite')} exclude each other (continue the run, or "
            "start again)"
        )
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise RunDirError(f"out_dir {run_dir} is a file; expected a directory for the run")
    if resume:
        return
    found = previous_run(run_dir)
    if not found:
        return
    if stepless_run(run_dir, found):
        overwrite = True  # a run that never took a step: replaced (its config.yaml, empty metrics)
    if not overwrite:
        resume_hint = f"continue it with {option('resume')}, or " if can_resume else ""
        raise RunDirError(
            f"{run_dir} already holds a run ({', '.join(found)}); {resume_hint}start again with "
            f"{option('overwrite')} "
            f"(deletes those files first), or choose another out_dir"
        )
    for name in found:
        path = Path(run_dir) / name.rstrip("/")
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def prepare_driver_dir(out: str | os.PathLike, what: str, *, resume: bool, overwrite: bool) -> Path:
    """The folder of a driver that runs many arms (a demo, an experiment), each resumable on its own:
    a folder holding anything but the CLI's lock is refused unless ``resume`` (keep it) or
    ``overwrite`` (empty it first); ``what`` names the driver in the message. Returns the folder,
    created."""
    out = Path(out)
    if resume and overwrite:
        raise RunDirError(f"{option('resume')} and {option('overwrite')} exclude each other")
    held = [p for p in out.iterdir() if p.name != LOCK_NAME] if out.is_dir() else []
    if held:
        if overwrite:
            for p in held:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        elif not resume:
            raise RunDirError(
                f"{out} already holds a {what}; continue it with {option('resume')}, start again with "
                f"{option('overwrite')}, or choose another out_dir"
            )
    out.mkdir(parents=True, exist_ok=True)
    return out


# -------------------------------------------------------------------------------------- resume
@dataclass
class ResumeInfo:
    checkpoint: Path
    step: int
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    breaking: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What a change does beyond its diff line (a learning-rate jump), shown by :meth:`describe`."""

    def describe(self, total_steps: int | None = None) -> str:
        of = f" of {total_steps}" if total_steps is not None else ""
        lines = [f"resuming from {self.checkpoint} (step {self.step}{of})"]
        if self.changes:
            lines.append("config changes against the run's saved config:")
            lines += [
                f"  {k}: {old!r} -> {new!r}" + ("  (forced)" if k in self.breaking else "")
                for k, old, new in self.changes
            ]
            lines += [f"  warning: {note}" for note in self.notes]
        return "\n".join(lines)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and other values are leaves."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(
    old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every dotted key whose value differs ("<unset>" where one side lacks it).
    A key the old config lacks (a run saved before the key existed) whose new value is its default in
    ``defaults`` is not a change."""
    a, b, d = flatten(old), flatten(new), flatten(defaults or {})
    missing = "<unset>"
    return [
        (k, a.get(k, missing), b.get(k, missing))
        for k in sorted(set(a) | set(b))
        if a.get(k, missing) != b.get(k, missing) and not (k not in a and k in d and b.get(k) == d[k])
    ]


def schedule_jump(old: dict[str, Any], new: dict[str, Any], step: int) -> str | None:
    """What a changed ``steps`` does to the learning rate of a resumed run, or None when nothing: a
    cosine schedule's horizon is ``steps`` (SFT: ``schedule_steps`` when set), so changing it moves the
    lr at the resumed ``step`` (``steps: 40 -> 100`` at step 30: the cosine restarts from nearer its
    peak). Compares :func:`~posttrain.train.optim.lr_at` at ``step`` under both configs."""
    from posttrain.train.optim import lr_at

    a, b = flatten(old), flatten(new)

    def lr(f: dict[str, Any]) -> float | None:
        total = f.get("schedule_steps") or f.get("steps")
        try:
            return lr_at(
                step,
                lr=float(f["optimizer.lr"]),
                total_steps=max(1, int(total)),
                schedule=str(f.get("optimizer.schedule", "constant")),
                warmup_steps=int(f.get("optimizer.warmup_steps", 0) or 0),
                min_lr_ratio=float(f.get("optimizer.min_lr_ratio", 0.0) or 0.0),
            )
        except (KeyError, TypeError, ValueError):  # a config without these keys: nothing to compare
            return None

    if a.get("steps") == b.get("steps"):
        return None
    before, after = lr(a), lr(b)
    if before is None or after is None or math.isclose(before, after, rel_tol=1e-6, abs_tol=1e-15):
        return None
    ratio = f"{after / before:.2f}x" if before > 0 else "from zero"
    horizon = "schedule_steps" if b.get("schedule_steps") else "steps"
    return (
        f"steps {a.get('steps')} -> {b.get('steps')} moves the {b.get('optimizer.schedule')} lr "
        f"schedule: the learning rate at step {step} jumps from {before:.3g} to {after:.3g} ({ratio}) "
        f"instead of continuing; keep {horizon}, or accept the jump"
    )


def is_harmless(key: str) -> bool:
    return any(key == h or key.startswith(h + ".") for h in HARMLESS_KEYS)


def saved_config(run_dir: str | os.PathLike, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The config the run was trained with: the checkpoint's copy, else ``config.yaml``."""
    if state is not None and isinstance(state.get("config"), dict):
        return state["config"]
    path = Path(run_dir) / "config.yaml"
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise RunDirError(f"{path}: invalid YAML ({e})") from None
        return data if isinstance(data, dict) else None
    return None


def check_resume(
    run_dir: str | os.PathLike,
    new_config: dict[str, Any],
    *,
    allow_config_change: bool = False,
    defaults: dict[str, Any] | None = None,
) -> ResumeInfo:
    """The checkpoint a resume will load and the config diff; raises :class:`RunDirError` when there
    is nothing to resume or the config changed in a way that breaks the run (see the module doc)."""
    from posttrain.train.checkpoint import read_trainer_state, resolve_checkpoint

    try:
        ckpt = resolve_checkpoint(run_dir)
    except FileNotFoundError as e:
        resume = option("resume")
        raise RunDirError(f"{resume}: nothing to resume: {e}; start a new run without {resume}") from None
    state = read_trainer_state(ckpt)
    info = ResumeInfo(checkpoint=ckpt, step=int(state["step"]))
    old = saved_config(run_dir, state)
    if old is None:
        return info
    info.changes = config_changes(old, new_config, defaults)
    info.breaking = [k for k, _, _ in info.changes if not is_harmless(k)]
    jump = schedule_jump(old, new_config, info.step)
    if jump is not None:  # `steps` is harmless only while the lr schedule does not depend on it
        info.breaking.append("steps")
        info.notes.append(jump)
    old_model = flatten(old).get("model.name")
    new_model = flatten(new_config).get("model.name")
    kl = max(float(flatten(old).get("kl.coef", 0) or 0), float(flatten(new_config).get("kl.coef", 0) or 0))
    if kl > 0 and old_model != new_model:
        raise RunDirError(
            f"{option('resume')}: model.name changed ({old_model!r} -> {new_model!r}) in a run with kl.coef > 0: the KL "
            f"reference is the run's initial model {old_model!r}; resuming would silently change it. "
            f"Keep model.name={old_model} (the policy itself is always loaded from the checkpoint)"
        )
    if info.breaking and not allow_config_change:
        diff = "\n".join(f"  {k}: {o!r} -> {n!r}" for k, o, n in info.changes if k in info.breaking)
        diff += "".join(f"\n  ({note})" for note in info.notes)
        raise RunDirError(
            f"{option('resume')}: the config differs from the one {ckpt} was trained with:\n{diff}\n"
            "these change what is trained, so the resumed run would not be the same experiment. Undo the "
            f"change, start a new run (another out_dir, or {option('overwrite')}), or force it with "
            f"{option('allow_config_change')}"
        )
    return info


def write_run_config(run_dir: str | os.PathLike, config: dict[str, Any], *, step: int = 0) -> Path:
    """Write ``config.yaml``. When a resumed run (``step > 0``) changed the config, the previous file
    is kept as ``config.until-step_NNNNNN.yaml`` first, so the folder records what ran when."""
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    text = yaml.safe_dump(config, sort_keys=False)
    if step > 0 and path.is_file():
        old = path.read_text(encoding="utf-8")
        if old != text:
            atomic_write_text(run_dir / f"config.until-step_{step:06d}.yaml", old)
    return atomic_write_text(path, text)


def start_run(
    run_dir: str | os.PathLike,
    config: dict[str, Any],
    *,
    step: int,
    overwrite: bool = False,
    allow_config_change: bool = False,
    defaults: dict[str, Any] | None = None,
) -> ResumeInfo | None:
    """What a trainer calls before writing (after taking the folder's lock, :func:`lock_run_dir`;
    :func:`end_run` releases it): a fresh run (``step == 0``) gets a folder without a
    previous run (or cleared with ``overwrite``); a resumed run (``step > 0``) has its config checked
    against the checkpoint's. Then ``config.yaml`` is written. Returns the resume info, if resumed."""
    lock = lock_run_dir(run_dir)  # held until end_run (re-entrant: the CLI took it already)
    try:
        info = None
        if step == 0:
            prepare_run_dir(run_dir, overwrite=overwrite)
        elif (Path(run_dir) / "checkpoints").is_dir():
            info = check_resume(run_dir, config, allow_config_change=allow_config_change, defaults=defaults)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        write_run_config(run_dir, config, step=step)
    except BaseException:
        lock.release()
        raise
    return info


def end_run(run_dir: str | os.PathLike) -> None:
    """What a trainer calls when its run ends (in a ``finally``): releases the lock :func:`start_run`
    took. A no-op where this process holds none (other ranks, a run that never started)."""
    key = os.path.realpath(run_dir)
    if key in _HELD:
        RunLock(key).release()


# -------------------------------------------------------------------------------- interruptions
def interrupted_message(
    run_dir: str | os.PathLike, step: int, total: int, *, resume_command: str | None
) -> str:
    """What Ctrl-C prints: where training stopped, the last checkpoint on disk, how to resume."""
    from posttrain.train.checkpoint import read_trainer_state, resolve_checkpoint

    head = f"interrupted at step {step} of {total}"
    try:
        ckpt = resolve_checkpoint(run_dir)
        saved = int(read_trainer_state(ckpt)["step"])
    except (FileNotFoundError, ValueError):
        return (
            f"{head}; no checkpoint was saved in {run_dir} (checkpoint.every=N saves one every N steps), "
            f"so there is nothing to resume: start again with {option('overwrite')}"
        )
    lost = f"; steps {saved + 1}..{step} will run again" if step > saved else ""
    cmd = f"\nresume with: {resume_command}" if resume_command else ""
    return f"{head}; last checkpoint: {ckpt} (step {saved}){lost}{cmd}"


def resume_command(command: str, config: str | os.PathLike | None, overrides: list[str]) -> str:
    """``posttrain rl --config X k=v ... --resume`` for the message after Ctrl-C."""
    parts = command.split()
    if config is not None:
        parts += ["--config", str(config)]
    parts += list(overrides)
    parts.append("--resume")
    return shlex.join(parts)
