"""`render --out-dir` in a GitOps folder: only ddpdeploy's own files change, hand edits are
refused by name, and the folder itself is never replaced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_runner import run_cli, run_main
from fs_helpers import mount_tmpfs, tmpfs_mountpoint

from ddpdeploy.adapters.out_dir import write_folder
from ddpdeploy.errors import UserError
from ddpdeploy.render.output import RECORD, parse_record, plan_folder, sha256

mountpoint = tmpfs_mountpoint  # the fixture, under the name the tests ask for

RENDER = ["render", "--image", "t:1", "--name", "j"]
JOB = "pytorchjob-j.yaml"
PVC = "persistentvolumeclaim-j-checkpoints.yaml"
POLICY = "networkpolicy-j.yaml"


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` and its bytes (None for folders), .git included."""
    return {
        str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


def render(out: Path, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_main(*RENDER, "--out-dir", str(out), *extra, cwd=cwd)


def one_line_error(res: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert res.returncode == code, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture
def gitops(tmp_path: Path) -> Path:
    """A rendered folder the user has added notes, a patch and a git repository to."""
    out = tmp_path / "deploy"
    assert render(out, "--", "--steps", "1").returncode == 0
    (out / "README.md").write_text("how we deploy\n")
    (out / "patch-gpu.yaml").write_text("- op: add\n")
    (out / ".git" / "objects").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "overlays").mkdir()
    return out


def test_rerender_keeps_everything_the_user_put_there(gitops):
    user = {k: v for k, v in snapshot(gitops).items() if not k.startswith(("pytorch", "kust"))}
    user.pop(RECORD)
    gitops.chmod(0o750)
    (gitops / JOB).chmod(0o640)
    inode = gitops.stat().st_ino
    res = render(gitops, "--", "--steps", "2")
    assert res.returncode == 0, res.stderr
    after = snapshot(gitops)
    assert {k: after[k] for k in user} == user
    assert b"- '2'\n" in after[JOB]
    assert gitops.stat().st_ino == inode  # the same folder, not a replacement
    assert oct(gitops.stat().st_mode & 0o777) == oct(0o750)
    assert oct((gitops / JOB).stat().st_mode & 0o777) == oct(0o640)
    assert not [p for p in gitops.iterdir() if "tmp" in p.name]


def test_record_is_sha256sum_format(gitops):
    res = subprocess.run(
        ["sha256sum", "-c", RECORD], cwd=gitops, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(parse_record((gitops / RECORD).read_text())) == {JOB, POLICY, "kustomization.yaml"}


@pytest.mark.parametrize("name", [JOB, "kustomization.yaml"])
def test_hand_edited_file_is_refused_by_name_and_nothing_changes(gitops, name):
    with open(gitops / name, "a") as fh:
        fh.write("patches: [{path: patch-gpu.yaml}]\n")
    before = snapshot(gitops)
    res = render(gitops, "--", "--steps", "2")
    one_line_error(res, 2, f"{gitops}/{name} was changed by hand since ddpdeploy wrote it")
    assert "kustomize overlay" in res.stderr
    assert snapshot(gitops) == before


def test_stale_file_is_removed_unless_edited(tmp_path):
    out = tmp_path / "deploy"
    spec = tmp_path / "job.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    assert render(out, "-f", str(spec)).returncode == 0
    (out / PVC).write_text((out / PVC).read_text() + "# mine\n")
    before = snapshot(out)
    res = render(out)  # no PVC any more: ddpdeploy would remove the edited file
    one_line_error(res, 2, f"{out}/{PVC} was changed by hand")
    assert snapshot(out) == before
    (out / PVC).write_text(before[PVC].decode().replace("# mine\n", ""))
    assert render(out).returncode == 0
    assert not (out / PVC).exists()
    assert set(parse_record((out / RECORD).read_text())) == {JOB, POLICY, "kustomization.yaml"}


def test_fresh_folder_with_user_files_is_fine_and_identical_files_are_adopted(tmp_path):
    out = tmp_path / "deploy"
    assert render(out).returncode == 0
    job = (out / JOB).read_bytes()
    (out / RECORD).unlink()  # e.g. written by an older ddpdeploy, or copied by hand
    (out / "README.md").write_text("x")
    assert render(out).returncode == 0  # same content: nothing is lost by writing it
    assert (out / JOB).read_bytes() == job and (out / "README.md").read_text() == "x"


def test_symlink_or_folder_in_our_place_is_refused(tmp_path):
    out = tmp_path / "deploy"
    assert render(out).returncode == 0
    target = tmp_path / "elsewhere.yaml"
    target.write_text("precious\n")
    (out / JOB).unlink()
    (out / JOB).symlink_to(target)
    one_line_error(render(out), 2, f"{out}/{JOB} is not a regular file")
    assert target.read_text() == "precious\n" and (out / JOB).is_symlink()


def test_unreadable_record_is_refused(tmp_path):
    out = tmp_path / "deploy"
    assert render(out).returncode == 0
    (out / RECORD).write_text("not a checksum  ../../etc/passwd\n")
    one_line_error(render(out), 2, f"{out}/{RECORD} is not the list of files ddpdeploy wrote")


def test_out_dir_dot_writes_into_the_working_directory_in_place(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("name: j\nimage: t:1\n")
    inode = tmp_path.stat().st_ino
    res = run_main("render", "--out-dir", ".", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert tmp_path.stat().st_ino == inode
    assert (tmp_path / "ddpdeploy.yaml").read_text() == "name: j\nimage: t:1\n"
    assert (tmp_path / JOB).is_file()


@pytest.mark.parametrize(
    ("target", "code", "text"),
    [
        ("/proc/x", 1, "--out-dir: cannot write /proc/x"),
        ("/nonexistent-parent/deploy", 2, "the parent folder of /nonexistent-parent/deploy"),
        ("/dev/null", 2, "--out-dir: /dev/null exists and is not a folder"),
    ],
)
def test_unwritable_out_dir_is_one_line(target, code, text):
    one_line_error(run_main(*RENDER, "--out-dir", target), code, text)


@pytest.mark.parametrize("under", ["sub", "sub/deeper"])
def test_a_file_where_the_parent_folder_should_be_is_named(tmp_path, under):
    # Found by the third hostile pass: `--out-dir afile/sub` said "the parent folder of
    # afile/sub does not exist" while afile was right there, a regular file.
    (tmp_path / "afile").write_text("keep\n")
    res = run_main(*RENDER, "--out-dir", f"afile/{under}", cwd=tmp_path)
    one_line_error(res, 2, f"--out-dir: afile is a file, not a folder, so afile/{under} cannot")
    assert (tmp_path / "afile").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_read_only_mount_is_one_line_exit_1(mountpoint):
    mount_tmpfs(mountpoint, "ro")
    # In a fresh interpreter: the system's refusal as a shell sees it (exit 1, one line).
    res = run_cli(*RENDER, "--out-dir", str(mountpoint / "deploy"))
    one_line_error(res, 1, "Read-only file system")


def test_full_disk_writes_nothing(mountpoint):
    mount_tmpfs(mountpoint, "size=4k")  # one page: the job file alone does not fit twice
    (mountpoint / "deploy").mkdir()
    (mountpoint / "deploy" / "README.md").write_text("x")
    res = render(mountpoint / "deploy", "--", *["--long-argument-" + "x" * 64] * 64)
    one_line_error(res, 1, "No space left on device")
    assert sorted(p.name for p in (mountpoint / "deploy").iterdir()) == ["README.md"]


def test_an_interrupted_render_is_not_mistaken_for_a_hand_edit(tmp_path):
    """After the interim record and only some files, the next render proceeds."""
    out = tmp_path / "deploy"
    write_folder(str(out), {"a.yaml": "old a\n", "b.yaml": "old b\n"})
    # What a second render decides; its interim record accepts old and new content.
    recorded = parse_record((out / RECORD).read_text())
    plan = plan_folder(
        str(out),
        {"a.yaml": "new a\n", "b.yaml": "new b\n"},
        recorded,
        {"a.yaml": sha256(b"old a\n"), "b.yaml": sha256(b"old b\n")},
    )
    (out / RECORD).write_text(plan.interim)
    (out / "a.yaml").write_text("new a\n")  # the crash came before b.yaml
    write_folder(str(out), {"a.yaml": "newer a\n"})  # proceeds, and removes b.yaml
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "a.yaml"]
    with pytest.raises(UserError, match="b.yaml was changed by hand"):
        plan_folder(str(out), {}, {"b.yaml": {sha256(b"x")}}, {"b.yaml": sha256(b"y")})


def test_a_folder_another_render_writes_is_refused_untouched(tmp_path: Path) -> None:
    # Found by the second hostile pass: two renders into one folder at once both said
    # "wrote", and the folder held both jobs' files with one job's kustomization.yaml.
    from ddpdeploy.fs import FolderLock

    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "mine.txt").write_text("kept\n")
    held = FolderLock(folder)  # as a render running meanwhile holds it
    try:
        with pytest.raises(UserError) as info:
            write_folder(str(folder), {"job.yaml": "kind: Job\n"})
    finally:
        held.release()
    assert str(info.value) == (
        f"--out-dir: another render is writing {folder}; wait for it to end, or render into "
        "another folder"
    )
    assert snapshot(folder) == {"mine.txt": b"kept\n"}
    write_folder(str(folder), {"job.yaml": "kind: Job\n"})  # the lock went with its holder
    assert (folder / "job.yaml").read_text() == "kind: Job\n"
