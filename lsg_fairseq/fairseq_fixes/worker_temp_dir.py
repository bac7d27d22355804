"""Leave no ``pymp-*`` folder in the temp dir after a run whose data loader had workers (no
upstream issue found; the mechanism is torch's and Python's, the trigger fairseq's).

fairseq builds its ``DataLoader`` with ``persistent_workers=True`` whenever ``--num-workers`` > 0
(the default is 1) and never shuts the workers down: at exit, multiprocessing terminates them
(SIGTERM). A worker that has sent a batch made a temp folder of its own on the way
(``multiprocessing.util.get_temp_dir``: the socket through which its tensors' file descriptors
pass), and a terminated worker cannot remove it. So every fairseq-train and fairseq-generate run
left a ``pymp-XXXXXXXX`` folder behind, holding a dead socket (a cluster's ``/tmp`` fills with them).

A process uses the temp folder of the process that started it, if that one had made it already.
So, for a run with workers, the wrapper makes the main process's folder before ``main`` runs: the
workers (and the ranks of a distributed run) use it, and the main process removes it when it exits,
after multiprocessing has stopped them. A run without workers gets none (a folder made for nothing
would be left by a process that ends without its exit handlers, killed or through ``os._exit``).
Wraps ``fairseq.distributed.utils.call_main`` (fairseq-train, -validate, -hydra-train) and
fairseq-generate's ``main`` when the plugin comes in through its ``--user-dir``.

The same folder holds the workers' sockets, whose paths AF_UNIX limits to 107 bytes: under a
longer ``TMPDIR`` a worker's feeder thread dies ("AF_UNIX path too long") and the loader waits for
its first batch forever, without a word. Such a run is refused before ``main``, in one line.
"""

import multiprocessing.util
import os
import sys

from fairseq.distributed import utils as distributed_utils

from lsg_fairseq.fairseq_fixes._wrap import wrap
from lsg_text.errors import ConfigError

SOCKET_PATH_MAX = 107  # bytes of an AF_UNIX socket path on Linux (sun_path: 108, NUL included)
SOCKET_NAME = len("/listener-XXXXXXXX")  # multiprocessing's name of a socket in the folder


def _num_workers(cfg) -> int:
    """``--num-workers`` of a run: a structured config's ``dataset``, or fairseq-generate's namespace."""
    return getattr(getattr(cfg, "dataset", cfg), "num_workers", 0) or 0


def _temp_dir_made_first(original):
    def main(cfg, *args, **kwargs):
        workers = _num_workers(cfg)
        if workers > 0:
            folder = multiprocessing.util.get_temp_dir()  # made once per process, removed at its exit
            if len(os.fsencode(folder)) + SOCKET_NAME > SOCKET_PATH_MAX:
                raise ConfigError(
                    f"--num-workers {workers}: the temp folder {folder} is too long a path for the data-loader "
                    f"workers' sockets (AF_UNIX: {SOCKET_PATH_MAX} bytes; the workers would wait forever): "
                    "set TMPDIR to a shorter folder, or --num-workers 0"
                )
        return original(cfg, *args, **kwargs)

    return main


def install() -> None:
    wrap(distributed_utils, "call_main", _temp_dir_made_first)
    generate = sys.modules.get("fairseq_cli.generate")
    if generate is not None:  # fairseq-generate is importing the plugin through --user-dir
        wrap(generate, "main", _temp_dir_made_first)
