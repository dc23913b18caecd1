"""Data staged once per node: the space file's ``data`` section.

A study names files or folders on the shared file system; each node copies
each one once, to a node-local folder (``stage_to``), when the first of its
trials calls ``trial.data_path(name)``; the node's other trials wait for
that copy and read it. A copy is used only once complete and current, and
the copies go when the study ends (unless ``keep``). See docs/staging.md.

- ``_section``: :class:`DataSection`, the validated section (checked by
  :mod:`hpo.space`);
- ``_expand``: ``$NAME`` / ``${NAME:-fallback}`` in paths, expanded on the node;
- ``_stage``: :func:`stage`, one item copied under the node's lock;
- ``_copies``: each copy in a folder of its own, held by the trials reading
  it (a lease), removed once none does: staging again never takes a
  running trial's files away;
- ``_marker``, ``_copy``, ``_room``: what a copy was made from, the copy
  itself with its progress, and the room it needs;
- ``_paths``: what ``trial.data_path`` asks (the copies, or a hand-made
  trial's sources);
- ``_cleanup``: the copies removed at the study's end;
- ``_errors``: :class:`StagingError` (the node's fault, never the trial's)
  and :class:`UnknownDataItem`.

>>> from hpo.data import DataSection, StagedData
>>> import pathlib, tempfile
>>> shared, local = pathlib.Path(tempfile.mkdtemp()), tempfile.mkdtemp()
>>> _ = (shared / "table.csv").write_text("a,b\\n1,2\\n")
>>> data = StagedData(DataSection({"table": str(shared / "table.csv")}, stage_to=local), "demo")
>>> copy = data.path("table")
>>> copy.read_text(), copy.relative_to(local).as_posix()
('a,b\\n1,2\\n', 'hpo-demo/.table.copy-1/table.csv')
"""

from hpo.data._cleanup import Removal, remove_copies, remove_node_copies
from hpo.data._errors import StagingError, UnknownDataItem
from hpo.data._expand import UnsetVariable, expand_variables, syntax_problem
from hpo.data._paths import DataPaths, SourcePaths, StagedData
from hpo.data._section import DEFAULT_STAGE_TO, DataSection, study_folder_name
from hpo.data._stage import STAGED_LOG, node_folder, stage

__all__ = [
    "DataSection", "DEFAULT_STAGE_TO", "study_folder_name", "DataPaths", "SourcePaths",
    "StagedData", "stage", "node_folder", "STAGED_LOG", "StagingError", "UnknownDataItem",
    "expand_variables", "syntax_problem", "UnsetVariable", "Removal", "remove_copies",
    "remove_node_copies",
]
