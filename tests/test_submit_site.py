"""hpo submit's site set-up: --setup lines, --scratch, and TOML site profiles
(--site, $HPO_SITE, ~/.config/hpo/site.toml), for both engines, without
SLURM. A real job whose set-up reaches the trials is in test_slurm.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from conftest import ROOT
from test_launchers import check_shell, directives, flags_of

# hpo, space: tests/conftest.py; no site profile of this machine's user leaks in.
pytestmark = pytest.mark.usefixtures("no_user_site")

SITES = ROOT / "launchers" / "sites"


def profile(tmp_path: Path, text: str, name: str = "site.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# /gpfs/env exists on the compute nodes only: the sourced file is not checked here.
SITE = """
setup = ["module load python/3.11", "source /gpfs/env/bin/activate"]
check_setup = false
scratch = "$TMPDIR/hpo"
partition = "acc"
qos = "acc_debug"
account = "bsc99"
sbatch = ["--constraint=highmem"]
"""


def script_of(hpo, *args) -> str:
    status, out, err = hpo("submit", *args, "--dry-run")
    assert status == 0, err
    return out


def first_python(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if '"$python"' in line and not line.lstrip().startswith("#")
                and "()" not in line and not line.startswith("    "))


def test_profile_setup_runs_before_python_and_dask_uses_scratch(hpo, space, tmp_path):
    script = script_of(hpo, space, "--time", "30", "--site", profile(tmp_path, SITE))
    d = directives(script)
    assert (d["--partition"], d["--qos"], d["--account"]) == ("acc", "acc_debug", "bsc99")
    assert "--constraint" in d and d["--constraint"] == "highmem"
    lines = script.splitlines()
    setup = [lines.index("module load python/3.11"), lines.index("source /gpfs/env/bin/activate")]
    # Verbatim, in order, outside `set -u`, before any Python of the job starts.
    assert setup[0] < setup[1] < first_python(lines)
    assert lines[setup[0] - 1] == "set +u" and lines[setup[1] + 1] == "set -u"
    # Dask's local directory is the scratch path, expanded on the node.
    assert 'export DASK_TEMPORARY_DIRECTORY="$TMPDIR/hpo"' in lines
    assert lines.index('export DASK_TEMPORARY_DIRECTORY="$TMPDIR/hpo"') < first_python(lines)
    # The site's own lines draw shellcheck's notes (a sourced file it cannot follow).
    check_shell(script, tmp_path, severity="warning")


def test_command_line_wins_over_the_profile_and_setup_appends(hpo, space, tmp_path):
    script = script_of(hpo, space, "--time", "30", "--site", profile(tmp_path, SITE),
                       "--partition", "gpp", "--scratch", "/local/$USER", "--setup", "export A='1 2'")
    d = directives(script)
    assert d["--partition"] == "gpp" and d["--qos"] == "acc_debug"
    lines = script.splitlines()
    assert lines.index("source /gpfs/env/bin/activate") < lines.index("export A='1 2'") < first_python(lines)
    assert 'export DASK_TEMPORARY_DIRECTORY="/local/$USER"' in lines
    check_shell(script, tmp_path, severity="warning")


def test_no_setup_no_block(hpo, space):
    script = script_of(hpo, space, "--time", "30")
    assert "set +u" not in script and "DASK_TEMPORARY_DIRECTORY" not in script


def test_profile_found_through_hpo_site_then_the_user_config(hpo, space, tmp_path, monkeypatch):
    user = tmp_path / "config" / "hpo" / "site.toml"
    user.parent.mkdir(parents=True)
    user.write_text('partition = "from-config"\n')
    assert directives(script_of(hpo, space, "--time", "30"))["--partition"] == "from-config"
    monkeypatch.setenv("HPO_SITE", str(profile(tmp_path, 'partition = "from-env"\n', "env.toml")))
    assert directives(script_of(hpo, space, "--time", "30"))["--partition"] == "from-env"
    given = profile(tmp_path, 'partition = "given"\n', "given.toml")
    assert directives(script_of(hpo, space, "--time", "30", "--site", given))["--partition"] == "given"
    assert "--partition" not in directives(script_of(hpo, space, "--time", "30", "--site", "none"))


@pytest.mark.parametrize("text, words", [
    ('setpu = ["module load x"]\n', ["unknown key 'setpu'", "did you mean 'setup'"]),
    ('setup = "module load x"\n', ["setup", "expected a list of strings"]),
    ('qos = 3\n', ["qos = 3", "expected a non-empty string"]),
    ('sbatch = ["constraint=x"]\n', ["sbatch", "not an option"]),
    ('scratch = "$(rm -rf ~)"\n', ["scratch", "$NAME"]),
    ('setup = ["a\\nb"]\n', ["one non-empty line"]),
    ('partition = "acc\n', ["not valid TOML", "line 1"]),
])
def test_bad_profile_exits_2_naming_the_key(hpo, space, tmp_path, text, words):
    path = profile(tmp_path, text)
    status, _, err = hpo("submit", space, "--time", "30", "--site", path, "--dry-run")
    assert status == 2 and str(path) in err and "fix:" in err, err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err


def test_missing_profile_and_bad_scratch_option(hpo, space, tmp_path):
    status, _, err = hpo("submit", space, "--time", "30", "--site", tmp_path / "nope.toml", "--dry-run")
    assert status == 2 and "nope.toml: cannot read the site profile" in err
    status, _, err = hpo("submit", space, "--time", "30", "--scratch", "/x; rm -rf /", "--dry-run")
    assert status == 2 and "--scratch" in err and "fix:" in err


def test_compss_sources_the_setup_and_works_on_local_disk(hpo, space, tmp_path, monkeypatch):
    site = profile(tmp_path, SITE + 'sc_cfg = "mn5.cfg"\ncompss_scratch = "local_disk"\n')
    status, out, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "30",
                           "--site", site, "--setup", "export B=2", "--dry-run")
    assert status == 0, err
    flags = flags_of(shlex.split(out))
    assert flags["--sc_cfg"] == "mn5.cfg" and flags["--worker_working_dir"] == "local_disk"
    assert (flags["--queue"], flags["--qos"], flags["--project_name"]) == ("acc", "acc_debug", "bsc99")
    env_script = Path(flags["--env_script"])
    assert env_script.parent == tmp_path / "runs" / "toy" / "jobs" and not env_script.exists()
    # Sourced by the job before COMPSs starts the master's Python (a module
    # the interpreter needs), and by each worker as it starts.
    assert flags["--pre_env_script"] == flags["--env_script"]
    assert "sbatch lines apply to the dask engine only" in err
    # Submitted (with a stand-in enqueue_compss), the script holds the lines in order.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "enqueue_compss").write_text("#!/bin/sh\necho 'Submitted batch job 7'\n")
    (fake / "enqueue_compss").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status, _, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "30",
                         "--site", site, "--setup", "export B=2")
    assert status == 0, err
    lines = env_script.read_text().splitlines()
    assert [l for l in lines if not l.startswith("#")] == [
        "module load python/3.11", "source /gpfs/env/bin/activate", "export B=2"]


def test_compss_refuses_a_node_variable_as_scratch(hpo, space):
    status, _, err = hpo("submit", space, "--engine", "compss", "--nodes", "2", "--time", "30",
                         "--sc-cfg", "x.cfg", "--scratch", "$TMPDIR", "--dry-run")
    assert status == 2 and "local_disk" in err, err


@pytest.mark.parametrize("name", ["marenostrum.toml", "generic.toml"])
def test_shipped_profiles_make_valid_scripts(hpo, space, tmp_path, name):
    # MareNostrum's GPFS is not mounted here: its environment is not checked.
    site = profile(tmp_path, (SITES / name).read_text() + "\ncheck_setup = false\n", name)
    script = script_of(hpo, space, "--time", "30", "--site", site)
    assert "set +u" in script and "DASK_TEMPORARY_DIRECTORY" in script
    check_shell(script, tmp_path, severity="warning")


def test_a_setup_line_sourcing_a_missing_file_is_refused(hpo, space, tmp_path, monkeypatch):
    """The shipped generic profile's environment line, uncommented but not
    adapted: the job would print an error and go on without it. Refused at
    submission with the line and the fix; a profile whose files exist on the
    compute nodes only says so with check_setup = false."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    text = (SITES / "generic.toml").read_text()
    assert '# "source $HOME/venvs/hpo/bin/activate",' in text
    site = profile(tmp_path, text.replace('# "source', '"source'))
    status, out, err = hpo("submit", space, "--time", "30", "--site", site, "--dry-run")
    assert status == 2 and out == "", err
    assert f"{site}: setup: 'source $HOME/venvs/hpo/bin/activate'" in err, err
    assert f"{home}/venvs/hpo/bin/activate: no such file on this host" in err
    assert f"add check_setup = false to {site}" in err and "fix:" in err
    # Adapted (the file is there), it is accepted.
    (home / "venvs" / "hpo" / "bin").mkdir(parents=True)
    (home / "venvs" / "hpo" / "bin" / "activate").write_text("")
    assert hpo("submit", space, "--time", "30", "--site", site, "--dry-run")[0] == 0
    # A --setup line is checked too, relative to the submit directory.
    status, _, err = hpo("submit", space, "--time", "30", "--site", "none", "--dry-run",
                         "--setup", ". env/missing.sh")
    assert status == 2 and "--setup: '. env/missing.sh': env/missing.sh: no such file" in err, err
    assert "add check_setup = false to a site profile (--site FILE)" in err
    # A variable this host lacks (the node's, or set by an earlier line) is not guessed at.
    assert hpo("submit", space, "--time", "30", "--site", "none", "--dry-run",
               "--setup", "source $HPO_NODE_ONLY_DIR/env.sh")[0] == 0
    nodes_only = profile(tmp_path, 'setup = ["source /nodes/only/env.sh"]\ncheck_setup = false\n',
                         "nodes.toml")
    assert hpo("submit", space, "--time", "30", "--site", nodes_only, "--dry-run")[0] == 0
    bad = profile(tmp_path, 'check_setup = "no"\n', "bad.toml")
    status, _, err = hpo("submit", space, "--time", "30", "--site", bad, "--dry-run")
    assert status == 2 and "check_setup = 'no': expected true or false" in err, err
