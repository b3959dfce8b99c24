"""The temporary folders of DataLoader workers, where their handovers make their Unix socket:
made by the training process, checked before the workers start, removed once they are gone.

A worker hands a batch's tensors over as file descriptors (PyTorch's ``file_descriptor`` sharing,
its default on Linux), through a Unix socket that multiprocessing makes in its temporary folder
(``TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX``).

- **Room for the socket.** A socket's path has at most 107 bytes: in a deeper folder every
  handover failed in the worker's feeder thread, where nobody sees it, and the training loop
  waited for its first batch for ever. Refused here, with what to do.
- **Who removes the folder.** A worker that made its own removed it as it exited, and only then:
  one killed (the out-of-memory killer), or terminated because it took longer than PyTorch's 5 s
  to stop on a loaded machine, left it behind. Each worker is given a folder made here instead,
  which the loader removes once the worker is gone, however it ended (a worker that exits still
  removes its own, as multiprocessing's would). Made here but not this process's own folder: a
  forked child inherits that one, and this process's exit deleted it under a child that outlived
  it (every handover of the child's workers then failed, and it waited for its first batch for ever).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
from typing import Any, Sequence

import torch.multiprocessing

#: The longest path a Unix socket may have (``sun_path``'s 108 bytes, less the NUL).
SOCKET_PATH_MAX = 107
#: The name multiprocessing gives a listener's socket: ``listener-`` and 8 random characters
#: (``sock-`` on the Pythons that choose a shorter temporary folder where needed).
_LISTENER_NAME = "listener-" + "x" * 8
_SHORTER_NAME = "sock-" + "x" * 8
_PREFIX = "pymp-"
#: Seconds to wait for a worker killed to be gone.
_END_S = 5.0


def make_worker_folders(count: int) -> list[str]:
    """A temporary folder for each of ``count`` workers (see the module docstring), in the folder
    multiprocessing would make its own in; refused where a handover's socket has no room in it."""
    base = _base_folder()
    if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        folder = os.path.join(base, _PREFIX + "x" * 8)  # (mkdtemp's names: the prefix and 8 characters)
        path = os.path.join(folder, _socket_name())
        if len(path.encode()) > SOCKET_PATH_MAX:
            raise RuntimeError(f"DataLoader workers hand batches over through a Unix socket in the temporary folder "
                               f"{folder}, whose path leaves no room for one ({len(path.encode())} bytes with the "
                               f"socket's name, at most {SOCKET_PATH_MAX}): set TMPDIR to a shorter folder "
                               f"(TMPDIR=/tmp), or pass num_workers=0")
    return [tempfile.mkdtemp(prefix=_PREFIX, dir=base) for _ in range(count)]


def take_worker_folder(folder: str) -> None:
    """Make ``folder`` the temporary folder of multiprocessing in this worker, removed as the
    worker exits (as multiprocessing removes one it made: late, after other exit handlers)."""
    multiprocessing.current_process()._config["tempdir"] = folder
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
                                  exitpriority=-100)


def remove_worker_folders(folders: Sequence[str], workers: Sequence[Any], rmtree: Any = shutil.rmtree,
                          end_s: float = _END_S) -> None:
    """Remove the workers' folders once the workers are gone: one still running after PyTorch's
    shutdown waited for it (5 s) is killed (stopped means gone; PyTorch's SIGTERM then is one a
    worker ignores, see :mod:`.job_signals`). What it uses is bound as it is defined: it may run
    as the interpreter finalizes, module names gone."""
    try:
        for worker in workers:
            try:
                if worker.exitcode is None:
                    worker.kill()
                    worker.join(timeout=end_s)
            except Exception:  # noqa: BLE001 - a closed process object, one this process did not start, or
                continue  # multiprocessing's modules gone as the interpreter finalizes: the folders go all the same
    finally:
        for folder in folders:
            try:
                rmtree(folder, ignore_errors=True)
            except Exception:  # noqa: BLE001 - as the interpreter finalizes, shutil's own names may be gone
                continue


def _base_folder() -> str:
    base = getattr(multiprocessing.util, "_get_base_temp_dir", None)  # (3.14: a shorter one where needed)
    return base(tempfile) if base else tempfile.gettempdir()


def _socket_name() -> str:
    return _SHORTER_NAME if hasattr(multiprocessing.util, "_get_base_temp_dir") else _LISTENER_NAME
