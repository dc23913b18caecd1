"""Test instruments for the processes a test starts (on ``PYTHONPATH``).

``HPO_TEST_STORAGE_SPY=DIR``: every Python process that starts (a study's
master, its Dask workers, an isolated trial's process) appends a line
``<class> <thread name>`` to ``DIR/<pid>`` each time it constructs a
JournalStorage, an RDBStorage or an InMemoryStorage. The conformance suites
read it: only the master's main thread may.

``HPO_TEST_UNREACHABLE_RELAY=1``: ``socket.create_connection`` fails as a
firewall between compute nodes and the master's node makes it fail ("No
route to host"), and the relay's Unix socket is not found, as on another
node: the store's relay cannot be reached (Dask's own connections do not
use it).
"""

import errno
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import threading

_DIR = os.environ.get("HPO_TEST_STORAGE_SPY")


class _Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "optuna.storages":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for cls in (module.JournalStorage, module.RDBStorage, module.InMemoryStorage):
                cls.__init__ = _spied(cls.__init__, cls.__name__)

        spec.loader.exec_module = exec_module
        return spec


def _spied(init, name):
    def __init__(self, *args, **kwargs):
        with open(os.path.join(_DIR, str(os.getpid())), "a") as record:
            record.write(f"{name} {threading.current_thread().name}\n")
        init(self, *args, **kwargs)
    return __init__


def _no_route(address, *args, **kwargs):
    raise OSError(errno.EHOSTUNREACH, f"No route to host (to {address[0]}:{address[1]})")


if _DIR:
    sys.meta_path.insert(0, _Spy())
def _no_relay_here(connect):
    def no_relay_here(sock, address):
        if isinstance(address, (str, bytes)) and address[:11] in ("\0hpo-relay-", b"\0hpo-relay-"):
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        return connect(sock, address)
    return no_relay_here


if os.environ.get("HPO_TEST_UNREACHABLE_RELAY"):
    socket.create_connection = _no_route
    socket.socket.connect = _no_relay_here(socket.socket.connect)
