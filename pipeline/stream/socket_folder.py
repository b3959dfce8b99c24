"""The folder where DataLoader workers' handovers make their Unix socket: checked before they start.

A worker hands a batch's tensors over as file descriptors (PyTorch's ``file_descriptor`` sharing,
its default on Linux), through a Unix socket that multiprocessing makes in its temporary folder
(``TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX``). A socket's path has at most 107 bytes: in a deeper
folder every handover failed in the worker's feeder thread, where nobody sees it, and the
training loop waited for its first batch for ever. Refused here, with what to do.
"""

from __future__ import annotations

import multiprocessing.util
import os

import torch.multiprocessing

#: The longest path a Unix socket may have (``sun_path``'s 108 bytes, less the NUL).
SOCKET_PATH_MAX = 107
#: The name multiprocessing gives a listener's socket: ``listener-`` and 8 random characters.
_LISTENER_NAME = "listener-" + "x" * 8


def check_socket_folder() -> None:
    """Refuse to start workers whose handovers could make no socket in the temporary folder."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    folder = multiprocessing.util.get_temp_dir()  # (made now, in this process, and shared by its workers)
    path = os.path.join(folder, _LISTENER_NAME)
    if len(path.encode()) > SOCKET_PATH_MAX:
        raise RuntimeError(f"DataLoader workers hand batches over through a Unix socket in the temporary folder "
                           f"{folder}, whose path leaves no room for one ({len(path.encode())} bytes with the "
                           f"socket's name, at most {SOCKET_PATH_MAX}): set TMPDIR to a shorter folder (TMPDIR=/tmp), "
                           f"or pass num_workers=0")
