"""The in-sandbox runner: PID 1 of every sandbox (Docker container or process namespace).

It is started once per sandbox and then serves requests, one JSON object per line on stdin, one
JSON reply per line on stdout. WHY a resident runner instead of `docker exec` per execution: an
exec costs a runc process spawn and several engine round trips (tens of ms); a request to a
process that is already running costs a pipe write and a fork. Being PID 1 also gives it the
powers a sandbox needs: orphans are re-parented to it, `kill(-1)` reaches every other process in
the sandbox (so nothing a program starts outlives its run), and the kernel refuses SIGKILL/SIGTERM
sent to it from inside its PID namespace, so a program cannot kill its parent.

Standard library only: it runs under whatever python3 the sandbox image has. Its source is shipped
to the sandbox as a `python3 -c` argument, so images need nothing agentrl-specific.

Requests: {"op": "ping"} | {"op": "run", "cmd": [...], "stdin": b64, "files": {path: b64},
"timeout": s, "max_output": n, "collect": [path], "env": {...}} | {"op": "read", "path": p} |
{"op": "reset"}. Replies carry "ok": true, or "ok": false and "error".
"""

import base64
import contextlib
import ctypes
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time

CONFIG = json.loads(sys.argv[1])
WORK = CONFIG["work_dir"]
SCRUB_DIRS = [WORK, *CONFIG.get("scrub_dirs", [])]
WRAPPER = CONFIG.get("wrapper", [])  # argv prefix for every program, e.g. a capability drop
RLIMITS = {getattr(resource, name): value for name, value in CONFIG.get("rlimits", {}).items()}
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "TMPDIR": CONFIG.get("tmp_dir", "/tmp"),
}
CHUNK = 1 << 16
IS_INIT = os.getpid() == 1


def b64(data):
    return base64.b64encode(data).decode("ascii")


def unb64(text):
    return base64.b64decode(text.encode("ascii"))


def make_non_dumpable():
    """Keep sandboxed programs (same uid in Docker) from ptracing this process or reading /proc/1/*."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def work_path(rel):
    """Resolve a path under the work dir; refuse anything that would land outside it."""
    full = os.path.realpath(os.path.join(WORK, rel))
    if full != WORK and not full.startswith(WORK + os.sep):
        raise ValueError(f"path escapes the work dir: {rel!r}")
    return full


def oom_kill_count():
    """The cgroup's OOM-kill counter (v2 or v1), or None when the sandbox has no memory cgroup."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kill_everything_else():
    """SIGKILL every process in the sandbox but this one, and reap them."""
    if not IS_INIT:  # kill(-1) outside a private PID namespace would hit the whole host user
        return
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        reap(block=True)
    reap(block=False)


def reap(block):
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def child_setup(cpu_seconds):
    for which, value in RLIMITS.items():
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def op_run(req):
    for rel, data in (req.get("files") or {}).items():
        path = work_path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(unb64(data))
    timeout = float(req["timeout"])
    max_output = int(req["max_output"])
    stdin_data = unb64(req.get("stdin") or "")
    env = dict(BASE_ENV, **(req.get("env") or {}))
    oom_before = oom_kill_count()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            WRAPPER + list(req["cmd"]),
            cwd=WORK,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: child_setup(int(timeout) + 1),
        )
    except OSError as exc:
        return {
            "ok": True,
            "exit_code": 127,
            "stdout": "",
            "stderr": b64(str(exc).encode()),
            "duration": time.monotonic() - start,
            "timed_out": False,
            "output_truncated": False,
            "memory_exceeded": False,
            "files": {},
        }
    out, err = bytearray(), bytearray()
    bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd, sent = proc.stdin.fileno(), 0
    if stdin_data:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    deadline = start + timeout
    timed_out = truncated = False
    exited = False
    while sel.get_map() and not truncated:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        # The run ends when the program exits, even if a background child still holds its pipes
        # open: poll for exit between reads, then drain only what is already buffered.
        events = sel.select(0 if exited else min(remaining, 0.05))
        if not events:
            if exited:
                break
            exited = proc.poll() is not None
            continue
        for key, _ in events:
            fd = key.fd
            if fd == stdin_fd:
                try:
                    sent += os.write(fd, stdin_data[sent : sent + CHUNK])
                except (BrokenPipeError, BlockingIOError) as exc:
                    if isinstance(exc, BrokenPipeError):
                        sent = len(stdin_data)
                if sent >= len(stdin_data):
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                sel.unregister(fd)
                continue
            room = max_output - len(out) - len(err)
            bufs[fd] += chunk[:room]
            if len(chunk) > room:
                truncated = True
    if not (timed_out or truncated):
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out or truncated:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    duration = time.monotonic() - start
    kill_everything_else()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if not stream.closed:
            stream.close()
    sel.close()
    oom_after = oom_kill_count()
    exit_code = proc.returncode
    # The cgroup OOM killer (Docker) shows in its counter; an address-space rlimit (process
    # backend) shows as the program's own MemoryError.
    memory_exceeded = (oom_before is not None and oom_after is not None and oom_after > oom_before) or (
        exit_code != 0 and b"MemoryError" in err[-4096:]
    )
    files = {}
    for rel in req.get("collect") or []:
        try:
            with open(work_path(rel), "rb") as f:
                files[rel] = b64(f.read(max_output))
        except (OSError, ValueError):
            continue
    return {
        "ok": True,
        # Killed by us (timeout / output limit): no exit code of its own. Killed by a signal: -N.
        "exit_code": None if (timed_out or truncated) else exit_code,
        "stdout": b64(bytes(out)),
        "stderr": b64(bytes(err)),
        "duration": duration,
        "timed_out": timed_out,
        "output_truncated": truncated,
        "memory_exceeded": memory_exceeded,
        "files": files,
    }


def op_read(req):
    with open(work_path(req["path"]), "rb") as f:
        return {"ok": True, "data": b64(f.read())}


def force_remove(func, path, _exc):
    """rmtree error hook: a program may have chmod-ed its own files read-only or unlistable."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
    except OSError:
        pass
    func(path)


def remove_sysv_ipc():
    """Remove System V shared memory, message queues and semaphores: they outlive the programs that
    made them (they belong to the sandbox's IPC namespace), so the next holder would find them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    ipc_rmid = 0
    removers = {
        "shm": lambda ident: libc.shmctl(ident, ipc_rmid, None),
        "msg": lambda ident: libc.msgctl(ident, ipc_rmid, None),
        "sem": lambda ident: libc.semctl(ident, 0, ipc_rmid),
    }
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():
                remove(int(fields[1]))


def op_reset(_req):
    kill_everything_else()
    remove_sysv_ipc()
    for top in SCRUB_DIRS:
        if not os.path.isdir(top):  # e.g. no /dev/shm in this sandbox
            continue
        for name in os.listdir(top):
            path = os.path.join(top, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=force_remove)
            else:
                os.unlink(path)
    return {"ok": True}


OPS = {
    "ping": lambda _req: {"ok": True, "pid": os.getpid()},
    "run": op_run,
    "read": op_read,
    "reset": op_reset,
}


def main():
    make_non_dumpable()
    # Python's own SIGINT handler would make SIGINT deliverable to PID 1; with SIG_DFL the kernel
    # drops every signal a sandboxed program sends to its init.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            reply = OPS[req["op"]](req)
        except Exception as exc:  # report, keep serving: the host decides whether to taint
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
    kill_everything_else()


if __name__ == "__main__":
    main()
