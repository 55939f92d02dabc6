"""Where the sandboxed interpreter runs: one interface, two backends (chosen by
:func:`posttrain.tools.sandbox.get_backend`).

A backend turns "run this Python command in this working folder" into a launch: the argument list,
the environment and the user the program ends up as. :func:`posttrain.tools.sandbox.run_sandboxed`
does the rest (limits, guards, output, time) the same way for both.

* ``bwrap`` (:class:`BwrapBackend`): bubblewrap (Debian's ``bubblewrap``, the tool Flatpak uses) puts
  the interpreter in new PID, network, IPC, UTS (and, where it can, cgroup and user) namespaces, with
  ``--die-with-parent`` and ``--new-session``. Its file system is a fresh tmpfs root that holds, read-only,
  ``/usr`` (and the ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` links or folders), ``/etc/ld.so.cache``
  and the Python install (the prefixes and site-packages folders of ``sys.executable``), a new ``/proc``
  of its own PID namespace, a minimal ``/dev``, an empty ``/tmp``, and writable only the call's
  working folder. The environment is emptied (``--clearenv``) and holds only ``PATH``, ``HOME``,
  ``TMPDIR``, the locale and the BLAS/OpenMP thread counts. Resource limits are set inside, by the
  interpreter's first lines (address space, CPU, file size, open files, processes). Run as root, the
  user namespace is not used (it would map the program to the host's root, whom ``RLIMIT_NPROC`` does
  not bind): the program drops to an unused uid of its own (:data:`SANDBOX_UID_BASE` + a random
  offset) before it reads its code, keeping no capability and, as bubblewrap always sets
  ``no_new_privs``, no way back through a setuid program.
* ``guard`` (:class:`GuardBackend`): the interpreter runs as the trainer's user, as a plain child process;
  only the in-process guard (an audit hook and patched modules, see :mod:`posttrain.tools.sandbox`)
  stands between the program and the machine. **It is not a security boundary.**

``auto`` picks ``bwrap`` when it is on ``PATH`` and a probe run works, else ``guard`` with a one-time
warning. ``bwrap`` required where it is missing or does not work raises :class:`SandboxUnavailableError`.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import site
import sys
import sysconfig
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from posttrain.utils.errors import PosttrainError, PosttrainWarning

__all__ = [
    "BACKEND_NAMES",
    "SANDBOX_UID_BASE",
    "BwrapBackend",
    "GuardBackend",
    "Launch",
    "SandboxBackend",
    "SandboxUnavailableError",
    "SandboxWarning",
]

#: Settings of ``sandbox``: ``auto`` resolves to one of the two backends.
BACKEND_NAMES = ("auto", "bwrap", "guard")
#: Run as root, the ``bwrap`` backend's program runs as uid/gid ``SANDBOX_UID_BASE + k`` (k < 2**20).
SANDBOX_UID_BASE = 2_000_000_000


class SandboxUnavailableError(PosttrainError, RuntimeError):
    """A required sandbox backend cannot run here (the message says why and how to get it)."""


class SandboxWarning(PosttrainWarning, RuntimeWarning):
    """The sandbox fell back to the in-process guard, which is not a security boundary."""


@dataclass(frozen=True)
class Launch:
    """How to start one sandboxed interpreter: ``argv``, the environment of the started process
    (``env``), its working folder (``cwd``) and the uid the program drops to before it reads its
    code (``uid``; None: it stays the trainer's user); ``processes``: how many processes ``RLIMIT_NPROC``
    already counts when the program starts (itself, and bubblewrap's init in a user namespace)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int | None = None
    processes: int = 1


class SandboxBackend(ABC):
    """One way to run the sandboxed interpreter. ``name``: the setting that selects it;
    ``boundary``: whether the kernel enforces it (True) or only the program's own interpreter (False)."""

    name: str
    boundary: bool

    @abstractmethod
    def launch(self, python: list[str], work: str, env: Mapping[str, str]) -> Launch:
        """The launch of ``python`` (the interpreter's argv) in the working folder ``work`` (which
        the launch may hand to another uid), with ``env`` as the program's whole environment."""

    def exit_status(self, returncode: int) -> int:
        """The program's exit status from the launched process's (negative: killed by that signal)."""
        return returncode


class GuardBackend(SandboxBackend):
    """A plain child process as the trainer's user; the in-process guard is all there is."""

    name = "guard"
    boundary = False

    def launch(self, python: list[str], work: str, env: Mapping[str, str]) -> Launch:
        return Launch(list(python), dict(env), work)


def _top_level(paths: list[str]) -> list[str]:
    """The paths none of whose ancestors is in the list (sorted, deduplicated)."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _python_paths() -> list[str]:
    """The folders the interpreter needs, outside ``/usr``: its prefixes, site-packages and the folder
    of its real executable (a venv's ``bin`` links into the base install)."""
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    cands += [os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_key = sysconfig.get_paths().get(key)
        if with_key:
            cands.append(with_key)
    with contextlib.suppress(AttributeError):  # some embedded builds have no getsitepackages
        cands += site.getsitepackages()
    real = [os.path.realpath(p) for p in cands if p and os.path.isdir(p)]
    keep = [p for p in real + [os.path.abspath(p) for p in cands if p and os.path.isdir(p)] if p != "/"]
    return _top_level([p for p in keep if not (p == "/usr" or p.startswith("/usr/"))])


class BwrapBackend(SandboxBackend):
    """bubblewrap namespaces around the interpreter (module docstring)."""

    name = "bwrap"
    boundary = True

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or shutil.which("bwrap") or "bwrap"

    def launch(self, python: list[str], work: str, env: Mapping[str, str]) -> Launch:
        root = os.geteuid() == 0
        args = [self.executable]
        if root:  # no user namespace: it would map the program to the host's root (see the module doc)
            args += [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-all", "--cap-drop", "ALL"]
        args += ["--die-with-parent", "--new-session", "--clearenv"]
        for key, val in env.items():
            args += ["--setenv", key, val]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        binds = ["/usr", *_python_paths()]
        folders: set[str] = set()  # every folder above a mount point, readable by the program's uid
        for p in [*binds, work, "/etc/ld.so.cache"]:
            parts = os.path.dirname(p.rstrip("/")).strip("/").split("/")
            folders.update("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0])
        for d in sorted(folders, key=lambda f: (f.count("/"), f)):
            args += ["--perms", "0755", "--dir", d]
        for p in binds:
            args += ["--ro-bind", p, p]
        for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                args += ["--ro-bind", link, link]
        args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        args += ["--bind", work, work, "--chdir", "/", "--"]  # the program enters ``work`` itself
        uid = None
        if root:
            uid = SANDBOX_UID_BASE + random.randrange(1 << 20)
            os.chown(work, uid, uid)
        return Launch(args + list(python), {}, work, uid, processes=1 if root else 2)

    def exit_status(self, returncode: int) -> int:
        """bwrap exits 128 + N when the program died of signal N; its own death stays negative."""
        return -(returncode - 128) if 128 < returncode < 128 + 65 else returncode
