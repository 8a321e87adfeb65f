"""One training run per run folder: an exclusive lock on `<run_dir>/.lock`.

Without it, two launches into the same --output-dir both train and interleave their checkpoints
and logs. The lock is an exclusive, non-blocking `fcntl.flock` on the file, held through a file
descriptor that stays open for the life of the run. The lock file also carries one JSON line naming
the holder (pid, host, start time, argv) so that a refused launch can say who holds the folder.

Only the main process of a job takes the lock: the other ranks of the same job are part of the same
run and must not try (they would be refused by their own main process). Processes forked by the
holder (e.g. data loader workers) share the lock while they live; `release` in such a child does
nothing but close its copy of the descriptor.

Stale locks: the kernel drops a flock when the last descriptor of its holder goes away, so a run
that died without releasing (SIGKILL, OOM killer, power loss) never keeps the folder locked. Its
lock file stays behind with the old JSON, and the next run takes it over and gets a warning
naming the previous holder. A clean `release` deletes the file, so an existing file with content
means the previous run did not end cleanly. An empty file carries no holder and is taken over
silently.

Before any other check of the folder, every rank asks `check_not_in_use`: a shared flock tried
and dropped at once. It can only collide with a launch starting at the same instant, which is then
refused as if the folder were in use.

Network file systems: flock decides, nothing else. On Linux NFS clients flock is emulated with
NFS byte-range locks and works across hosts, but with the `nolock` or `local_lock=flock` mount
options it is only local to one client, and two hosts can then both hold the "exclusive" lock.
The pid and host in the file are only what the messages report; they are never used to decide
whether the lock is held. Needs `fcntl` (Linux, macOS).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import final

from .config import ConfigError

LOCK_NAME = ".lock"


@final
class RunLock:
    """Exclusive lock on a run folder. `acquire()` it in the job's main process, `release()` at the end.

    Also a context manager: `with RunLock(run_dir) as lock:` acquires (the take-over warning, if any,
    is in `lock.warning`) and releases on exit.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.warning: str | None = None
        self._fd: int | None = None
        self._owner_pid: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str | None:
        """Take the lock; return None, or a warning when it took over the lock of a run that died.

        Raises ConfigError (one line, naming the folder and the holder) when another process holds it.
        Acquiring a lock this object already holds does nothing and returns None.
        """
        if self._fd is not None:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = _read(fd)
                os.close(fd)
                raise ConfigError(_in_use(self.run_dir, text)) from None
            except BaseException:
                os.close(fd)
                raise
            # The previous holder may have released (unlinked the file) between our open and our flock:
            # then we locked a deleted file. Only a lock on the file that is at the path counts.
            if _same_file(fd, self.path):
                break
            os.close(fd)

        previous = _read(fd)
        self.warning = None
        if previous.strip():
            holder = _describe(previous) or "holder unknown: the lock file is unreadable"
            self.warning = f"took over the lock of a run that ended without releasing it ({holder})"

        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "argv": sys.argv,
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # drops the flock
            raise
        self._fd = fd
        self._owner_pid = os.getpid()
        return self.warning

    def release(self) -> None:
        """Delete the lock file and drop the lock. Idempotent; does nothing when the lock is not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.getpid() == self._owner_pid:  # a forked child only closes its copy of the descriptor
                if _same_file(fd, self.path):
                    self.path.unlink(missing_ok=True)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({str(self.run_dir)!r}, held={self.held})"


def check_not_in_use(run_dir: str | os.PathLike[str]) -> None:
    """Raise acquire's ConfigError when a live process holds the folder's lock, without taking it:
    a shared flock is tried and dropped at once, and nothing is created or written. The trainer asks
    this first, so a launch into a folder whose run is still training hears that before any advice
    about the run the folder holds ("pass --resume", which would only meet the lock)."""
    run_dir = Path(run_dir)
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file, or no folder: nobody holds it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # dropped by the close below
    except BlockingIOError:
        raise ConfigError(_in_use(run_dir, _read(fd))) from None
    finally:
        os.close(fd)


def _in_use(run_dir: Path, text: str) -> str:
    holder = _describe(text)
    who = f"another run ({holder})" if holder else "another process"
    return f"--output-dir: {run_dir} is in use by {who}; wait for it to finish, or choose another --output-dir"


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 65536, 0).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _describe(text: str) -> str | None:
    """'pid N on HOST, started ...' from a lock file's JSON, or None when it names no pid."""
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    out = f"pid {info['pid']} on {info.get('host') or 'an unknown host'}"
    if info.get("started"):
        out += f", started {info['started']}"
    return out


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
