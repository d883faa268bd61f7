"""`ddpdeploy collect` as users run it: the source is chosen explicitly (a local run's
folder is taken and said; without one and without --from, never the cluster), and NAME is
validated on every job verb before anything is read or asked. What each room does behind
it: test_checkpoint.py, test_plain.py, test_debug.py, test_destination.py, test_source.py,
test_pod.py, test_volume.py."""

from __future__ import annotations

import pytest
from cli_runner import run_cli

JOB_VERBS = [
    ["collect", "--to", "out", "--from", "local"],
    ["status"],
    ["logs"],
    ["down"],
    ["scale", "--nodes", "2"],
    ["resume"],
]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("verb", JOB_VERBS, ids=[v[0] for v in JOB_VERBS])
@pytest.mark.parametrize("name", ["../../../other", "a,b=c", "UPPER", "x" * 64, ""])
def test_name_is_validated_on_every_job_verb(tmp_path, monkeypatch, capsys, verb, name):
    from ddpdeploy.cli import main  # in-process: 30 cases, each stops at parsing

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([verb[0], name, *verb[1:]])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: Invalid value for 'NAME': ") and "DNS-1035 label" in line
    assert list(tmp_path.iterdir()) == []


def test_a_bad_name_is_refused_before_any_cluster_call(tmp_path):
    out = run_cli("down", "a,b=c", env={"KUBECONFIG": str(tmp_path / "none")})
    assert out.returncode == 2
    assert one_line(out.stderr).startswith("error: Invalid value for 'NAME': 'a,b=c' must be")


def test_a_local_run_folder_is_taken_and_said(local_run, tmp_path):
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), cwd=local_run)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "collect: reading the local run's folder .ddpdeploy/checkpoints/j (--from local)",
        "collected ddpdeploy checkpoint step 2 from .ddpdeploy/checkpoints/j into "
        f"{tmp_path / 'out'}",
    ]


def test_no_local_folder_and_no_from_never_turns_to_the_cluster(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "would-be-read")}
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert "no local run's folder .ddpdeploy/checkpoints/j" in line
    assert "--from cluster" in line and "--from compose --volume" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# Found by the second hostile pass: --to '' collected into the current folder (typer reads ''
# as Path('.')), --file '' said "--file:  is not ...", and --volume or --image with a source
# that reads neither was ignored.
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--to", ""], "error: --to: give the folder to collect into (e.g. --to ./ckpt)"),
        (["--to", "out", "--file", ""], "error: --file: an empty name; give a file name"),
        (["--to", "out", "--from", "local", "--volume", "v"], "error: --volume: only --from"),
        (["--to", "out", "--from", "cluster", "--volume", "v"], "error: --volume: only --from"),
        (["--to", "out", "--from", "local", "--image", "i"], "error: --image: --from local"),
    ],
)
def test_flags_no_source_reads_are_refused_before_anything_is_read(
    local_run, monkeypatch, capsys, flags, said
):
    from ddpdeploy.cli import main

    monkeypatch.chdir(local_run)
    before = sorted(p.relative_to(local_run) for p in local_run.rglob("*"))
    with pytest.raises(SystemExit) as stop:
        main(["collect", "j", *flags])
    assert stop.value.code == 2
    assert one_line(capsys.readouterr().err).startswith(said)
    assert sorted(p.relative_to(local_run) for p in local_run.rglob("*")) == before


def test_a_volume_alone_reads_the_compose_volume(tmp_path):
    # --volume names a compose run's volume: it needs no --from compose beside it.
    out = run_cli("collect", "j", "--to", "out", "--volume", "v", cwd=tmp_path,
                  env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})  # fmt: skip
    assert out.returncode == 1
    assert one_line(out.stderr).startswith("error: cannot reach the Docker engine at unix://")


# Found by the third hostile pass: `--from cluster --image` took any text (the helper pod was
# made, then waited out --timeout on a name no registry has), and --timeout took nan, 0 and
# negative numbers (`--timeout nan` made a helper pod, then said "Pending after nans").
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--image", "Not An/Image"], "error: --image: 'Not An/Image' is not an image reference"),
        (["--image", "t:1@sha256:12"], "error: --image: digest sha256:12… is invalid"),
        (["--timeout", "nan"], "error: Invalid value for '--timeout': write 'nan' as a plain"),
        (["--timeout", "inf"], "error: Invalid value for '--timeout': write 'inf' as a plain"),
        (["--timeout", "0"], "error: Invalid value for '--timeout': 0 is not a number of"),
        (["--timeout", "-5"], "error: Invalid value for '--timeout': -5 is not a number of"),
    ],
)
def test_a_bad_image_or_timeout_for_the_cluster_is_refused_before_the_cluster_is_asked(
    tmp_path, monkeypatch, capsys, flags, said
):
    from ddpdeploy.cli import main

    kubeconfig = tmp_path / "kubeconfig"  # read, it would say it is not there: never read
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["collect", "j", "--to", "out", "--from", "cluster", *flags])
    assert stop.value.code == 2
    assert one_line(capsys.readouterr().err).startswith(said)
    assert list(tmp_path.iterdir()) == []


# Found by the fourth outside-scripts pass: the pytorch/examples tutorial saves a relative
# snapshot.pt; after its smoke run, `collect` said only "the folder is empty", with no word
# of where the snapshot went or where the script must save.
def test_an_empty_local_folder_names_what_the_last_run_wrote_in_the_workspace(tmp_path):
    import json

    (tmp_path / ".ddpdeploy" / "checkpoints" / "j").mkdir(parents=True)
    (tmp_path / "snapshot.pt").write_bytes(b"weights")
    stat = (tmp_path / "snapshot.pt").stat()
    record = {"snapshot.pt": [stat.st_mtime_ns, stat.st_size], "gone.pt": [1, 2]}
    (tmp_path / ".ddpdeploy" / "smoke").mkdir()
    (tmp_path / ".ddpdeploy" / "smoke" / "written.json").write_text(json.dumps(record))
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), "--from", "local", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert one_line(out.stderr) == (
        "error: no checkpoint in .ddpdeploy/checkpoints/j: the folder is empty (a ddpdeploy "
        "checkpoint is ckpt-step-000000005.pt and its .json; any other script's files are "
        "collected as they are); the last smoke --local run wrote snapshot.pt in the workspace "
        "instead: save under $DDPDEPLOY_CHECKPOINT_DIR, which is this folder"
    )
    assert not (tmp_path / "out").exists()
    # Without such files, the line is as it was.
    (tmp_path / "snapshot.pt").unlink()
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), "--from", "local", cwd=tmp_path)
    assert one_line(out.stderr).endswith("any other script's files are collected as they are)")
