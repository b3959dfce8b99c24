"""The folder where DataLoader workers' handovers make their Unix socket: checked before they start.

A worker hands a batch's tensors over as file descriptors (PyTorch's ``file_descriptor`` sharing,
its default on Linux), through a Unix socket that multiprocessing makes in its temporary folder
(``TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX``). A socket's path has at most 107 bytes: in a deeper
folder every handover failed in the worker's feeder thread, where nobody sees it, and the
training loop waited for its first batch for ever. Refused here, with what to do.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import tempfile

import torch.multiprocessing

#: The longest path a Unix socket may have (``sun_path``'s 108 bytes, less the NUL).
SOCKET_PATH_MAX = 107
#: The name multiprocessing gives a listener's socket: ``listener-`` and 8 random characters
#: (``sock-`` on the Pythons that choose a shorter temporary folder where needed).
_LISTENER_NAME = "listener-" + "x" * 8
_SHORTER_NAME = "sock-" + "x" * 8


def check_socket_folder() -> None:
    """Refuse to start workers whose handovers could make no socket in the temporary folder."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    folder = _temp_folder()
    path = os.path.join(folder, _socket_name())
    if len(path.encode()) > SOCKET_PATH_MAX:
        raise RuntimeError(f"DataLoader workers hand batches over through a Unix socket in the temporary folder "
                           f"{folder}, whose path leaves no room for one ({len(path.encode())} bytes with the "
                           f"socket's name, at most {SOCKET_PATH_MAX}): set TMPDIR to a shorter folder (TMPDIR=/tmp), "
                           f"or pass num_workers=0")


def _temp_folder() -> str:
    """multiprocessing's temporary folder in this process, or (where it has made none yet) where
    each worker will make its own: named, not made. One made here is a forked child's too, and
    this process's exit deletes it under a child that outlives it (every handover of the child's
    workers then failed, and it waited for its first batch for ever)."""
    made = multiprocessing.current_process()._config.get("tempdir")  # (what get_temp_dir gives once made)
    if made:
        return made
    base = getattr(multiprocessing.util, "_get_base_temp_dir", None)  # (3.14: a shorter one where needed)
    return os.path.join(base(tempfile) if base else tempfile.gettempdir(), "pymp-" + "x" * 8)


def _socket_name() -> str:
    return _SHORTER_NAME if hasattr(multiprocessing.util, "_get_base_temp_dir") else _LISTENER_NAME
