"""Run model-written Python in a separate, limited process: :func:`run_python`.

**Where it runs** (``backend``, :mod:`posttrain.tools.backends`): ``bwrap`` puts the interpreter in
kernel namespaces (no network, its own PIDs and ``/proc``, a read-only file system that holds only
the system's ``/usr`` and the Python install, an empty environment): that is the security boundary.
``guard`` runs it as a plain child process, where the guard described below is all there is.
``auto`` (the default) picks ``bwrap`` where it works and warns once when it falls back. The guard
below runs in both, so a program sees the same refusals; under ``bwrap`` a program that gets past
it meets the kernel's walls (docs/tools.md has the escape table of each backend).

Each call starts a fresh interpreter (``sys.executable -I -B``: no user site, no ``PYTHON*``
variables, no bytecode written) in its own process group, in a new temporary folder that is its
working directory, ``HOME`` and ``TMPDIR`` and is deleted afterwards, with a minimal environment
(``PATH``, ``LANG``, one BLAS/OpenMP thread). The code goes in on stdin; stdout and stderr go to
files outside that folder, of which the caller reads only the first :attr:`SandboxLimits.max_output_chars`
characters. Settings are a frozen :class:`SandboxLimits`.

**What it protects against** (a model's mistakes, and casual misuse):

* runaway time: the wall-clock limit (default 5 s) kills the whole process group (``SIGKILL``);
  ``RLIMIT_CPU`` is a second stop;
* runaway memory: ``RLIMIT_AS`` (default 512 MiB) makes a large allocation a ``MemoryError`` in the
  child instead of swapping or OOM-killing the trainer;
* runaway output: at most ``max_output_chars`` characters come back (the rest is cut and the result
  says so); each file the child writes, its stdout and stderr included, is capped by ``RLIMIT_FSIZE``;
* network: before the code runs, ``socket.socket``, ``socket.create_connection``,
  ``socket.getaddrinfo`` and the other resolvers are replaced with functions raising
  ``PermissionError``, and an audit hook (:func:`sys.addaudithook`) refuses every ``socket.*`` event
  (so ``_socket`` used directly is refused too);
* new processes: the audit hook refuses ``subprocess.Popen``, ``os.system``, ``os.exec*``,
  ``os.fork*``, ``os.posix_spawn*``, ``os.spawn*``, ``os.kill``/``os.killpg`` (the code cannot signal
  the trainer), ``_posixsubprocess.fork_exec`` is replaced, and ``RLIMIT_NPROC`` is 0;
* file writes outside the temporary folder: the audit hook refuses ``open`` in a write mode and
  ``os.remove``/``rename``/``mkdir``/``rmdir``/``chmod``/``chown``/``utime``/``truncate``/``link``/
  ``symlink``/``shutil.rmtree`` ... for a path that resolves (symbolic links followed) outside it;
* changing its own limits (``resource.setrlimit``/``prlimit`` events), ``ctypes`` (importing it
  raises ``ImportError``; numpy, which treats it as optional, still imports; sympy does not) and
  walking the heap with ``gc.get_objects``/``get_referrers``.

**What it does NOT protect against.** It is not a security boundary against a determined attacker.
The audit hook and the patched modules live in the same interpreter as the code they watch: a program
written to escape can get around them (ctypes or any other way to write the interpreter's memory, a
native extension module written to disk and imported, a CPython bug), and then it runs with the
trainer's user, files and network.
Reading files is allowed (anything the trainer's user can read). Disk use is capped per file, not in
total. ``RLIMIT_NPROC`` does not bind root (the audit hook is then the only process guard), and root
could also raise its own limits if it got past the hook. For untrusted code at scale, run the
interpreter inside a container or a kernel sandbox (gVisor, nsjail, firejail, a VM) with no network
and a read-only file system; this module is a guard against accidents of a model being trained, not
against adversaries. It needs a POSIX system (Linux; macOS ignores some limits).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field

from posttrain.tools.backends import (
    BACKEND_NAMES,
    BwrapBackend,
    GuardBackend,
    SandboxBackend,
    SandboxUnavailableError,
    SandboxWarning,
)
from posttrain.tools.deadline import cancellable
from posttrain.utils.errors import InvalidValueError

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_sandboxed"]

MIB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    ``timeout_s``: wall-clock seconds before the process group is killed; ``memory_mb``: address
    space (``RLIMIT_AS``) in MiB; ``cpu_time_s``: CPU seconds (``RLIMIT_CPU``; None: the wall limit
    rounded up, plus one); ``max_output_chars``: characters of stdout+stderr returned;
    ``max_file_mb``: size of any file written, stdout and stderr included (``RLIMIT_FSIZE``);
    ``max_open_files``: ``RLIMIT_NOFILE``; ``max_processes``: processes and threads the program may
    start (``RLIMIT_NPROC``, under the ``bwrap`` backend only, where it counts the sandbox's own
    processes; the guard backend sets 0 and refuses new processes in the audit hook)."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    cpu_time_s: int | None = None
    max_output_chars: int = 4000
    max_file_mb: int = 16
    max_open_files: int = 64
    max_processes: int = 8

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_time_s if self.cpu_time_s is not None else math.ceil(self.timeout_s) + 1


@dataclass(frozen=True)
class SandboxResult:
    """One run: what it printed (``stdout``, ``stderr`` as read back, possibly cut), its exit status
    (negative: killed by that signal), which limit stopped it (``limit``: None, ``"time"``, ``"cpu"``,
    ``"memory"``, ``"file size"``), whether output was cut, and the wall time."""

    stdout: str
    stderr: str
    returncode: int | None
    limit: str | None
    truncated: bool
    elapsed_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.limit is None

    @property
    def text(self) -> str:
        """stdout, then stderr, then one ``[...]`` line per limit hit: what the model gets back."""
        parts = [p.rstrip("\n") for p in (self.stdout, self.stderr) if p.strip()]
        parts += list(self.notes)
        return "\n".join(parts) if parts else "[no output]"


# The child's first code: read the program, set the limits, install the guards, run the program.
# Everything it needs is bound before the program runs (the program can rebind module attributes).
_BOOTSTRAP = r"""
import sys, os, json, resource, traceback
cfg = json.loads(sys.argv[1])
if cfg["uid"] is not None:  # bwrap as root: leave root (and every capability) before reading the code
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
os.chdir(cfg["cwd"])
code = sys.stdin.buffer.read().decode("utf-8", "replace")
sys.stdin.close()
sys.stdin = open(os.devnull)
sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
sys.dont_write_bytecode = True

def _lim(name, soft, hard=None):
    r = getattr(resource, name, None)
    if r is not None:
        try:
            resource.setrlimit(r, (soft, soft if hard is None else hard))
        except (ValueError, OSError):
            pass

_lim("RLIMIT_AS", cfg["memory"])
_lim("RLIMIT_CPU", cfg["cpu"], cfg["cpu"] + 1)
_lim("RLIMIT_FSIZE", cfg["fsize"])
_lim("RLIMIT_NOFILE", cfg["nofile"])
_lim("RLIMIT_CORE", 0)
_lim("RLIMIT_NPROC", cfg["nproc"])

import socket, _socket, _posixsubprocess

def _no_network(*a, **k):
    raise PermissionError("sandbox: network access is disabled")

class _NoSocket(socket.socket):
    def __init__(self, *a, **k):
        _no_network()

socket.socket = socket.SocketType = _socket.socket = _NoSocket
for _n in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
           "gethostbyaddr", "getnameinfo", "socketpair", "fromfd"):
    setattr(socket, _n, _no_network)
    if hasattr(_socket, _n):
        setattr(_socket, _n, _no_network)

def _no_process(*a, **k):
    raise PermissionError("sandbox: starting processes is disabled")

_posixsubprocess.fork_exec = _no_process

def _make_hook(root, realpath, join, isabs, fspath, readlink, getcwd, WRITE, PError):
    DENY = ("socket.", "subprocess.", "os.exec", "os.fork", "os.posix_spawn", "os.spawn", "os.system",
            "os.kill", "os.killpg", "pty.", "ctypes.", "resource.setrlimit", "resource.prlimit",
            "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.startfile", "webbrowser.",
            "signal.pthread_kill")
    PATHS = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,),
             "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
             "os.symlink": (1,), "os.link": (0, 1), "os.mkfifo": (0,), "os.mknod": (0,),
             "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,),
             "os.lchmod": (0,), "shutil.rmtree": (0,), "shutil.chown": (0,),
             "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1)}
    DIR_FD = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.chmod": 2, "os.chown": 3, "os.utime": 3,
              "os.symlink": 2, "os.mkfifo": 2, "os.mknod": 3, "shutil.rmtree": 1}
    NO_IMPORT = ("ctypes", "_ctypes")  # an ImportError: numpy and others treat ctypes as optional
    ALLOWED = (os.devnull,)
    busy = []

    def inside(path, dir_fd=None):
        try:
            if isinstance(path, int):
                target = readlink("/proc/self/fd/%d" % path)
            else:
                p = fspath(path)
                if isinstance(p, bytes):
                    p = p.decode("utf-8", "surrogateescape")
                if not isabs(p):
                    cwd = dir_fd is None or dir_fd < 0  # AT_FDCWD
                    base = getcwd() if cwd else readlink("/proc/self/fd/%d" % dir_fd)
                    p = join(base, p)
                target = realpath(p)
        except Exception:
            return False
        return target == root or target.startswith(root + "/") or target in ALLOWED

    def hook(event, args):
        if busy:
            return
        busy.append(1)
        try:
            if event == "import" and args and args[0] in NO_IMPORT:
                raise ImportError("sandbox: module %s is disabled" % args[0])
            if event.startswith(DENY):
                if event.startswith("socket."):
                    raise PError("sandbox: network access is disabled (%s)" % event)
                raise PError("sandbox: %s is not allowed" % event)
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None, None))[:3]
                if isinstance(path, int):
                    return
                writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & WRITE)
                if writes and not inside(path):
                    raise PError("sandbox: writing outside the working folder is not allowed: %s" % (path,))
            elif event in PATHS:
                dfd = args[DIR_FD[event]] if event in DIR_FD and len(args) > DIR_FD[event] else None
                for i in PATHS[event]:
                    if i < len(args) and args[i] is not None and not inside(args[i], dfd):
                        raise PError("sandbox: %s outside the working folder is not allowed: %s"
                                     % (event, args[i]))
        finally:
            busy.pop()

    return hook

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
sys.addaudithook(_make_hook(os.path.realpath(os.getcwd()), os.path.realpath, os.path.join,
                            os.path.isabs, os.fspath, os.readlink, os.getcwd, _WRITE, PermissionError))

def _run(code, exit=os._exit, stdout=sys.stdout, stderr=sys.stderr):
    status = 0
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=stderr)
            status = 1
    except BaseException as e:
        line = e.lineno if isinstance(e, SyntaxError) else None
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<code>":
                line = tb.tb_lineno
            tb = tb.tb_next
        try:
            msg = traceback.format_exception_only(type(e), e)[-1].strip()
        except BaseException:
            msg = type(e).__name__
        where = " (line %d)" % line if line else ""
        try:
            stderr.write("%s%s\n" % (msg, where))
        except BaseException:
            pass
        status = 3 if isinstance(e, MemoryError) else 1
    for s in (stdout, stderr):
        try:
            s.flush()
        except BaseException:
            pass
    exit(status)

_run(code)
"""

_SIGNAL_LIMIT = {signal.SIGXCPU: "cpu"}


def _read_head(path: str, limit: int) -> tuple[str, int]:
    """(first ``limit`` characters of a file, its size in bytes)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
    return data.decode("utf-8", "replace")[:limit], size


def _read_tail(path: str, limit: int) -> tuple[str, int]:
    """(last ``limit`` characters of a file, its size in bytes)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - limit * 4))
        data = f.read()
    return data.decode("utf-8", "replace")[-limit:], size


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc/<pid>/task/*/children``; [] elsewhere)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    return out


def _wait_gone(pids: list[int], limit_s: float = 2.0) -> None:
    """Wait (at most ``limit_s``) until each of ``pids`` has exited. For the init of a PID namespace
    that means every process in it is gone: the kernel kills them all and reaps them before init
    becomes a zombie, so a call returns only once nothing of the program runs."""
    end = time.monotonic() + limit_s
    for pid in pids:
        while time.monotonic() < end:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
            except OSError:
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.005)


def _remove_tree(path: str) -> None:
    def retry(func, p, _exc):  # a folder the code made read-only
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def run_sandboxed(
    code: str,
    limits: SandboxLimits | None = None,
    backend: str | SandboxBackend = "auto",
    *,
    cancel: bool = True,
) -> SandboxResult:
    """Run ``code`` in a fresh limited interpreter (see the module docstring) under ``backend``
    (``auto``, ``bwrap``, ``guard`` or a :class:`~posttrain.tools.backends.SandboxBackend`); never raises
    for anything the code does (an unknown or, for ``bwrap``, unavailable backend raises before it runs).
    ``cancel``: :func:`posttrain.tools.deadline.cancel_calls` may kill the run (not the bwrap probe)."""
    limits = limits or SandboxLimits()
    box = get_backend(backend)
    root = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    work = os.path.join(root, "work")
    os.mkdir(work, 0o700)
    out_path, err_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
    cfg = {
        "memory": int(limits.memory_mb) * MIB,
        "cpu": int(limits.cpu_seconds),
        "fsize": int(limits.max_file_mb) * MIB,
        "nofile": int(limits.max_open_files),
        "nproc": 0,
        "uid": None,
        "cwd": work,
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": work,
        "TMPDIR": work,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    start = time.monotonic()
    timed_out = False
    returncode: int | None = None
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                python = [sys.executable, "-I", "-B", "-c", _BOOTSTRAP]
                launch = box.launch(python, work, env)
                cfg["uid"] = launch.uid
                if not isinstance(box, GuardBackend):
                    cfg["nproc"] = int(limits.max_processes) + launch.processes
                proc = subprocess.Popen(
                    [*launch.argv, json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=launch.cwd,
                    env=launch.env,
                    start_new_session=True,  # its own process group, killed as a whole
                    close_fds=True,
                )
            except OSError as e:
                return SandboxResult("", "", None, None, False, 0.0, (f"[sandbox error: cannot start: {e}]",))
            try:
                with cancellable(proc) if cancel else contextlib.nullcontext():  # for a stopping run
                    proc.communicate(code.encode("utf-8", "replace"), timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                inner = _children(proc.pid)  # bwrap: the init of the sandbox's PID namespace
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: anything it started goes too
                proc.wait()
                _wait_gone(inner)
            returncode = box.exit_status(proc.returncode)
        elapsed = time.monotonic() - start
        max_chars = max(int(limits.max_output_chars), 1)
        err_text, err_size = _read_tail(err_path, min(1000, max_chars // 2))
        out_text, out_size = _read_head(out_path, max_chars - len(err_text))
    finally:
        _remove_tree(root)

    notes = []
    limit = None
    mib = f"{limits.max_file_mb} MiB"
    if timed_out:
        limit = "time"
        notes.append(f"[killed: time limit {limits.timeout_s:g} s]")
    elif returncode is not None and returncode < 0 and _SIGNAL_LIMIT.get(-returncode) == "cpu":
        limit = "cpu"
        notes.append(f"[killed: CPU time limit {limits.cpu_seconds} s]")
    elif returncode == 3 and "MemoryError" in err_text:
        limit = "memory"
        notes.append(f"[memory limit {limits.memory_mb} MiB]")
    elif returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        notes.append(f"[killed by signal {name}]")
    elif "File too large" in err_text:
        limit = "file size"
        notes.append(f"[file size limit {mib}]")
    elif returncode not in (0, 1, None):
        notes.append(f"[exit status {returncode}]")
    truncated = out_size > len(out_text.encode("utf-8")) or err_size > len(err_text.encode("utf-8"))
    if truncated:
        notes.append(
            f"[output truncated: {len(out_text) + len(err_text)} characters shown of "
            f"{out_size + err_size} bytes written]"
        )
    if err_size > len(err_text.encode("utf-8")):
        err_text = "..." + err_text
    return SandboxResult(out_text, err_text, returncode, limit, truncated, elapsed, tuple(notes))


def run_python(code: str, limits: SandboxLimits | None = None, backend: str | SandboxBackend = "auto") -> str:
    """Run Python ``code`` in the sandbox (``backend``: see :func:`run_sandboxed`); return its stdout, then the error line if it raised, then
    a ``[...]`` line for each limit it hit (``[killed: time limit 5 s]``, ``[memory limit 512 MiB]``,
    ``[output truncated: ...]``)."""
    return run_sandboxed(code, limits, backend).text


# ------------------------------------------------------------------------------ choosing a backend
_GUARD_WARNED = threading.Event()


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why the ``bwrap`` backend cannot run here (None: it can): not on ``PATH``, or a probe run
    (``print('ok')`` in the sandbox) failed, with bubblewrap's own message. Checked once per process."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (bwrap) is not on PATH; install it (Debian/Ubuntu: apt-get install bubblewrap)"
    res = run_sandboxed("print('ok')", SandboxLimits(timeout_s=20), backend=BwrapBackend(exe), cancel=False)
    if res.stdout.strip() == "ok":
        return None
    detail = (res.stderr.strip().splitlines() or res.notes or ("no output",))[-1]
    return f"bwrap is on PATH ({exe}) but a probe run failed: {detail}"


def get_backend(name: str | SandboxBackend = "auto") -> SandboxBackend:
    """The backend for a ``sandbox`` setting: ``bwrap`` (refused with :class:`SandboxUnavailableError`
    where it cannot run), ``guard``, or ``auto`` (``bwrap`` where it works, else ``guard`` with a
    warning, once per process, that the guard is not a security boundary). A backend object passes."""
    if isinstance(name, SandboxBackend):
        return name
    if name not in BACKEND_NAMES:
        raise InvalidValueError(f"sandbox must be one of {list(BACKEND_NAMES)}, got {name!r}")
    if name == "guard":
        return GuardBackend()
    problem = bwrap_problem()
    if problem is None:
        return BwrapBackend()
    if name == "bwrap":
        raise SandboxUnavailableError(f"sandbox 'bwrap' was required but cannot run: {problem}")
    if not _GUARD_WARNED.is_set():
        _GUARD_WARNED.set()
        warnings.warn(
            f"sandbox 'auto' fell back to the in-process guard ({problem}). The guard is NOT a security "
            "boundary: code written to escape it runs as the trainer's user. Install bubblewrap or set "
            "sandbox: bwrap to require it.",
            SandboxWarning,
            stacklevel=2,
        )
    return GuardBackend()
