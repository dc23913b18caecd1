"""The durable store of a study: an Optuna storage inside a run directory.

The storage is the single source of truth: trials are created in it by the
master, workers write reports and results to it (each append is fsync'd
before the call returns), and the master learns about finished trials by
reading it. Killing the master therefore loses nothing.

While a study runs, its journal has one writer: the master's relay
(:mod:`hpo.store._relay`), which group-commits the appends that every process
sends it over TCP (one write and one fsync per round, whatever the number of
writers). A worker that cannot reach it appends directly under the journal's
file lock; readers always read the file.

Any SQLAlchemy URL (``sqlite:///...``, ``postgresql://...``) may replace the
journal. SQLite is fine on a local disk; on a shared file system prefer the
journal (SQLite locking over NFS is unreliable).

- :mod:`hpo.store.records`: the layout of what is stored, its contract, and
  the readers and builders of each record (pure functions);
- :class:`StudyStore`: reads and writes one study's trials;
- :class:`RunDir`: the run directory around it;
- :class:`SnapshotJournal`: a journal that readers replay from a snapshot on.
"""

from hpo.store import records
from hpo.store._files import write_atomically
from hpo.store._journal import JournalFile
from hpo.store._lease import MasterLease, StudyBusy
from hpo.store._run_dir import JOURNAL_FILE, RunDir
from hpo.store._snapshot import SnapshotJournal, save_journal_snapshot
from hpo.store._study import StudyStore, open_storage, open_study_store
from hpo.store.records import TrialStatus

__all__ = ["records", "RunDir", "StudyStore", "TrialStatus", "open_storage", "open_study_store",
           "write_atomically", "JOURNAL_FILE", "MasterLease", "StudyBusy",
           "JournalFile", "SnapshotJournal", "save_journal_snapshot"]
