"""The durable store of a study: an Optuna storage inside a run directory.

The storage is the single source of truth, and a running study has one
reader and one sequencer of it: the relay in the master process. Trials are
created there by the master; a trial's process holds no storage at all: it
speaks the store protocol to the relay (a :class:`TrialLink`), which
group-commits every process's writes (one write and one fsync per round),
feeds the master's one Optuna replica, and answers each request, once
durable, with what the trial must do next. A process that cannot reach the
relay appends to the journal directly under its file lock and reads the
study's decisions from its control file. Readers outside a run (``hpo
status``, the dashboard, optuna-dashboard) read the file.

Any SQLAlchemy URL (``sqlite:///...``, ``postgresql://...``) may replace the
journal. SQLite is fine on a local disk; on a shared file system prefer the
journal (SQLite locking over NFS is unreliable).

The parts, each in its own module:

- :mod:`hpo.store.records`: the layout of what is stored, its contract (every
  key, who writes it, who reads it), and pure readers and builders;
- ``_format``: Optuna's journal format (op codes by name, the records hpo
  writes, readers of their fields), the one module that knows it;
- ``_journal``: the journal file, kept readable after a crash (knows nothing
  of the relay); ``_snapshot``: shortcuts for its readers and the next
  master (the state at a journal record: Optuna's replay, the relay's ledger);
- ``_protocol``: the store protocol (frames, requests, what an answer
  promises); ``_writes``: what each request writes;
- ``_relay`` (:class:`StudyRelay`: connections, rounds, durability),
  ``_requests`` (what each request writes and is answered) and ``_ledger``:
  the master's side;
  ``_link`` (:class:`TrialLink`): a trial's side; ``_control``: the control file;
- ``_study`` (:class:`StudyStore`), ``_run_dir`` (:class:`RunDir`),
  ``_lease`` (:class:`MasterLease`): the study as the master and the readers see it.
"""

from hpo.store import records
from hpo.store._control import CONTROL_FILE, ControlFile
from hpo.store._epoch import EPOCH_ATTR, EPOCH_SUFFIX, journal_epoch, write_epoch_file
from hpo.store._files import MACHINE_FAULTS, process_alive, process_stopped, unwritable, write_atomically
from hpo.store._journal import HELD_SUFFIX, LOCK_SUFFIX, JournalFile, clear_dead_lock, lock_holder
from hpo.store._lease import LEASE_FILE, MasterLease, StudyBusy
from hpo.store._ledger import Pruning
from hpo.store._link import Ended, RelayConnection, TrialLink
from hpo.store._protocol import Decision, Halted, MalformedRequest, local_socket_name, split_relay
from hpo.store._relay import StudyRelay, relay_interface
from hpo.store._run_dir import JOURNAL_FILE, RunDir
from hpo.store._snapshot import (
    Mark,
    SnapshotJournal,
    gc_paused,
    is_placeholder,
    read_snapshot,
    records_read,
    replay_dump,
    save_journal_snapshot,
    write_snapshot,
)
from hpo.store._storage_url import check_storage_url
from hpo.store._study import StudyStore, open_storage
from hpo.store.records import TrialContext, TrialStatus, context_of

__all__ = ["records", "RunDir", "StudyStore", "TrialStatus", "open_storage", "write_atomically",
           "JOURNAL_FILE", "LEASE_FILE", "MasterLease", "StudyBusy", "JournalFile", "SnapshotJournal",
           "save_journal_snapshot", "StudyRelay", "relay_interface", "clear_dead_lock", "lock_holder",
           "LOCK_SUFFIX", "HELD_SUFFIX",
           "TrialLink", "RelayConnection", "Ended", "Decision", "Halted", "MalformedRequest", "split_relay",
           "local_socket_name", "Pruning",
           "ControlFile", "CONTROL_FILE", "EPOCH_ATTR", "EPOCH_SUFFIX", "journal_epoch", "write_epoch_file",
           "TrialContext", "context_of", "check_storage_url",
           "Mark", "read_snapshot", "write_snapshot", "replay_dump", "records_read",
           "is_placeholder", "gc_paused", "process_alive", "process_stopped", "unwritable", "MACHINE_FAULTS"]
