"""Spec values and init's files as a hostile pass found them (spec2): amounts no node holds,
byte sizes without a unit in exponent form, CLI numbers in Python's own syntax, a hint to a
field that does not exist, and init's schema file beside the spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_main
from fs_helpers import without_dac_override

from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.errors import UserError
from ddpdeploy.paths import SCHEMA_FILE


def refused(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text(f"image: a\n{text}")
    with pytest.raises(UserError) as info:
        spec_from_flags(path)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    return str(info.value)


def taken(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text(f"image: a\n{text}")
    spec_from_flags(path)


@pytest.mark.parametrize("cpu", ["1e30", "1e400", "9" * 29, "12345678901234567890Gi", "100001"])
def test_more_cpus_than_any_node_has_is_one_line(tmp_path, cpu):
    # `1e28` and above ended in decimal.InvalidOperation from threads_per_proc's `//`.
    assert f"cpu: '{cpu}' is more CPUs than any node has" in refused(tmp_path, f"cpu: {cpu}\n")


def test_the_most_cpus_render_their_share(tmp_path):
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text("image: a\ncpu: 100000\nprocs: 3\n")
    assert spec_from_flags(path).threads_per_proc == 33333


@pytest.mark.parametrize("field", ["memory", "shmSize", "logSize", "checkpoint.size"])
@pytest.mark.parametrize("amount", ["1e3", "1e-3", "1e9", "1E3", "1e400", "16e-9999999"])
def test_a_byte_size_in_exponent_form_has_no_unit(tmp_path, field, amount):
    # The check looked at the suffix only: `1e-3` rendered (compose's shm_size: 1).
    head, _, tail = field.partition(".")
    text = f"{head}: {{{tail}: {amount}}}\n" if tail else f"{head}: {amount}\n"
    assert f"{field}: '{amount}' has no unit" in refused(tmp_path, text)


@pytest.mark.parametrize(
    ("amount", "said"),
    [
        ("1k", "'1k' is 1000 bytes, less than 1Mi"),
        ("1.5Ki", "'1.5Ki' is 1536 bytes, less than 1Mi"),
        ("8Ei", "'8Ei' is more bytes than Kubernetes and Docker count"),
        ("12345678901234567890Gi", "is more bytes than Kubernetes and Docker count"),
    ],
)
def test_byte_sizes_no_container_or_counter_takes_are_refused(tmp_path, amount, said):
    assert said in refused(tmp_path, f"shmSize: {amount}\n")


@pytest.mark.parametrize("amount", ["1Mi", "1E", "7Ei", "+1Gi", "1.5Gi", "1048576k"])
def test_byte_sizes_with_a_unit_in_range_are_taken(tmp_path, amount):
    taken(tmp_path, f"memory: {amount}\n")


@pytest.mark.parametrize(
    ("args", "flag", "shown"),
    [
        (["render", "--nodes", "1_0"], "--nodes", "'1_0'"),
        (["render", "--nodes", "2.0"], "--nodes", "'2.0'"),
        (["render", "--nodes", " 2 "], "--nodes", "' 2 '"),
        (["render", "--gpus", "\u0663"], "--gpus", "'\u0663'"),
        (["render", "--ranks-every", "2.0"], "--ranks-every", "'2.0'"),
        (["render", "--max-restarts", "1_0"], "--max-restarts", "'1_0'"),
        (["render", "--straggler-factor", "1_5"], "--straggler-factor", "'1_5'"),
        (["render", "--hang-timeout", "1_0"], "--hang-timeout", "'1_0'"),
        (["render", "--probe-min-busbw", "nan"], "--probe-min-busbw", "'nan'"),
        (["smoke", "--steps", "1_0"], "--steps", "'1_0'"),
        (["smoke", "--timeout", "1_0"], "--timeout", "'1_0'"),
        (["logs", "j", "--tail", "1_0"], "--tail", "'1_0'"),
        (["logs", "j", "--node", "0", "--node", "1.0"], "--node", "'1.0'"),
        (["scale", "j", "--nodes", "0x2"], "--nodes", "'0x2'"),
        (["collect", "j", "--step", "1_0"], "--step", "'1_0'"),
        (["collect", "j", "--timeout", "inf"], "--timeout", "'inf'"),
    ],
)
def test_number_flags_take_what_the_spec_takes(tmp_path, args, flag, shown):
    # Python's int() and float() read `1_0` as ten: a typo of 1.5 as 1_5 became 15.
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert f"'{flag}': write {shown} as a plain decimal" in line, line
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["smoke", "--steps", "0"], "'--steps': 0 is less than 1"),
        (["smoke", "--timeout", "0.5"], "'--timeout': 0.5 is less than 1"),
        (["logs", "j", "--index", "-1"], "'--index': -1 is less than 0"),
        (["collect", "j", "--timeout", "1e400"], "'--timeout': '1e400' is too large a number"),
    ],
)
def test_number_flags_keep_their_bounds(tmp_path, args, said):
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 2 and said in res.stderr, res


def test_plain_numbers_in_flags_are_taken(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main("render", "--nodes", "+3", "--straggler-factor", "1.5e0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "replicas: 3" in res.stdout
    assert "value: '1.5'" in res.stdout


@pytest.mark.parametrize(
    "key", ["foo_bar", "my-field", "'a b'", "labels_x", "'[bold red]X'", "Nodes_count"]
)
def test_no_hint_to_a_field_that_does_not_exist(tmp_path, key):
    message = refused(tmp_path, f"{key}: 1\n")
    assert "`ddpdeploy init` writes a file listing every field" in message
    assert "camelCase" not in message


@pytest.mark.parametrize(
    ("text", "camel"),
    [
        ("shm_size: 1Gi\n", "'shmSize'"),
        ("Image: a\n", "'image'"),
        ("checkpoint: {claim_name: c}\n", "'claimName'"),
        ("tolerations: [{operator: Exists, toleration_seconds: 5}]\n", "'tolerationSeconds'"),
    ],
)
def test_the_hint_names_a_real_field(tmp_path, text, camel):
    assert f"keys are camelCase like Kubernetes': {camel}" in refused(tmp_path, text)


def _schema_kept(tmp_path: Path, before: bytes) -> None:
    res = run_main("init", cwd=tmp_path)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert SCHEMA_FILE in line and "--force" in line, line
    assert not (tmp_path / "ddpdeploy.yaml").exists()  # nothing half-written
    assert (tmp_path / SCHEMA_FILE).read_bytes() == before


def test_init_keeps_a_schema_file_it_did_not_write(tmp_path):
    (tmp_path / SCHEMA_FILE).write_text("USER DATA\n")
    _schema_kept(tmp_path, b"USER DATA\n")
    (tmp_path / SCHEMA_FILE).write_text('{"title": "mine", "properties": {}}')
    _schema_kept(tmp_path, b'{"title": "mine", "properties": {}}')


def test_init_keeps_a_link_at_the_schema_path(tmp_path):
    (tmp_path / "target.json").write_text("{}")
    os.symlink("target.json", tmp_path / SCHEMA_FILE)
    _schema_kept(tmp_path, b"{}")
    assert (tmp_path / SCHEMA_FILE).is_symlink()


def test_init_refreshes_its_own_schema_and_force_replaces_any(tmp_path):
    assert run_main("init", cwd=tmp_path).returncode == 0
    (tmp_path / "ddpdeploy.yaml").unlink()
    schema = json.loads((tmp_path / SCHEMA_FILE).read_text())
    schema["description"] = "an older one"
    (tmp_path / SCHEMA_FILE).write_text(json.dumps(schema))
    assert run_main("init", cwd=tmp_path).returncode == 0  # ours: refreshed
    assert json.loads((tmp_path / SCHEMA_FILE).read_text())["description"] != "an older one"
    (tmp_path / "ddpdeploy.yaml").unlink()
    (tmp_path / SCHEMA_FILE).write_text("USER DATA\n")
    assert run_main("init", "--force", cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / SCHEMA_FILE).read_text())["title"] == "ddpdeploy.yaml"


def test_init_names_a_folder_at_the_schema_path(tmp_path):
    (tmp_path / SCHEMA_FILE).mkdir()
    res = run_main("init", cwd=tmp_path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line == (
        f"error: cannot write {SCHEMA_FILE} (the JSON Schema init writes beside the spec): "
        "it is a folder; move it away"
    )
    assert not (tmp_path / "ddpdeploy.yaml").exists()


def test_init_for_a_script_not_there_yet_says_so_in_its_line(tmp_path):
    res = run_main("init", "--script", "train.py", cwd=tmp_path)
    assert res.returncode == 0
    (line,) = res.stderr.strip().splitlines()
    assert line.endswith("; train.py is not a file in this folder yet"), line
    (tmp_path / "ddpdeploy.yaml").unlink()
    (tmp_path / "train.py").write_text("print(1)\n")
    res = run_main("init", "--script", "train.py", cwd=tmp_path)
    assert "not a file" not in res.stderr


def test_a_script_through_dotdot_inside_is_named_by_its_one_spelling(tmp_path):
    assert refused(tmp_path, "command: {script: src/../train.py}\n").endswith(
        "command.script: 'src/../train.py' goes through '..'; write it as 'train.py'"
    )
    assert "leaves the workspace" in refused(tmp_path, "command: {script: src/../../t.py}\n")
    assert "names no file" in refused(tmp_path, "command: {script: src/..}\n")


def test_compose_out_dash_is_stdout(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main("compose", "--out", "-", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("# Written by ddpdeploy compose")
    assert not (tmp_path / "-").exists()


def test_compose_out_made_meanwhile_is_named_as_such(tmp_path, monkeypatch):
    # Stand-in for the race of two `compose --out` (2 in 25 rounds lost it): the other's
    # file lands between the check and the commit, which no timing here makes certain.
    from ddpdeploy.commands import compose

    def other_wrote_first(out, spec_file, force):
        (tmp_path / "c.yaml").write_text("# Written by ddpdeploy compose; the other one\n")
        return False

    monkeypatch.setattr(compose, "_may_replace", other_wrote_first)
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main("compose", "--out", "c.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert "c.yaml was made by another process while this one wrote it" in res.stderr
    assert (tmp_path / "c.yaml").read_text().endswith("the other one\n")


@pytest.mark.parametrize(
    ("value", "named"),
    [("a" * 16, "'" + "a" * 16 + "'"), ("eth 0", "'eth 0'"), ("^lo,e/x", "'^lo,e/x': 'e/x'")],
)
def test_nccl_socket_ifname_takes_interface_names_only(tmp_path, value, named):
    message = refused(tmp_path, f"network: {{ncclSocketIfname: '{value}'}}\n")
    assert f"network.ncclSocketIfname: {named} is not a network interface name" in message


@pytest.mark.parametrize("value", ["eth0", "^lo,docker", "=eth0", "^=ib0,enp1s0f1"])
def test_nccl_socket_ifname_takes_nccls_own_syntax(tmp_path, value):
    taken(tmp_path, f"network: {{ncclSocketIfname: '{value}'}}\n")


# ---- spec3: the fixes' neighbours --------------------------------------------------------
@pytest.mark.parametrize(
    ("amount", "fix"),
    [
        ('"9999999999999999999"', "16Gi"),  # it offered 9999999999999999999Gi, over 8Ei
        ("1048576", "1Mi"),  # it offered 1048576Gi (a PiB)
        ("1048576000m", "1Mi"),
        ("16", "16Gi"),
        ("16m", "16Gi"),
    ],
)
def test_the_unit_offered_is_one_the_spec_takes(tmp_path, amount, fix):
    message = refused(tmp_path, f"memory: {amount}\n")
    assert message.endswith(f"give a unit, e.g. {fix}"), message
    taken(tmp_path, f"memory: {fix}\n")


@pytest.mark.parametrize("value", ["1e-400", "'1.0e-400'", "5e-99999"])
def test_a_positive_number_that_reads_as_0_is_refused(tmp_path, value):
    # hangTimeoutSeconds: 1e-400 rendered DDPDEPLOY_HANG_TIMEOUT_S=-1: the watchdog off.
    message = refused(tmp_path, f"diagnostics: {{hangTimeoutSeconds: {value}}}\n")
    assert "is too small a number (it reads as 0)" in message


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--hang-timeout", "1e-400"], "'1e-400' is too small a number (it reads as 0)"),
        (["--probe-min-busbw", "1e-9999"], "'1e-9999' is too small a number"),
        (["--nodes", "1" * 101], "is more than any count"),
        (["--probe-min-busbw", "1e00001"], None),  # ten, a long exponent: taken
    ],
)
def test_number_flags_at_their_edges(tmp_path, args, said):
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main("render", *args, cwd=tmp_path)
    if said is None:
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2 and said in res.stderr, res.stderr


def test_zero_written_as_zero_still_turns_the_watchdog_off(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\ndiagnostics: {hangTimeoutSeconds: 0e5}\n")
    assert "value: '-1'" in run_main("render", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    ("text", "where", "meant"),
    [
        ("shm-size: 1Gi\n", "(top level)", "'shmSize'"),  # the flags' spelling
        ("ShmSize: 1Gi\n", "(top level)", "'shmSize'"),
        ("shmsize: 1Gi\n", "(top level)", "'shmSize'"),
        ("diagnostics: {hang-timeout-seconds: 1}\n", "diagnostics", "'hangTimeoutSeconds'"),
        # A misspelt required key: its "Field required" came first and hid the hint.
        ("network: {rdma: {Resource: x, count: 1}}\n", "network.rdma", "'resource'"),
    ],
)
def test_the_hint_names_the_field_whatever_the_case_or_separator(tmp_path, text, where, meant):
    message = refused(tmp_path, text)
    assert f"{where}: unknown field " in message, message
    assert f"; keys are camelCase like Kubernetes': {meant}" in message, message


def test_compose_out_dot_slash_dash_is_the_file_named_dash(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main("compose", "--out", "./-", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "wrote ./-\n"
    assert (tmp_path / "-").read_text().startswith("# Written by ddpdeploy compose")
    empty = run_main("compose", "--out", "", cwd=tmp_path)
    assert empty.returncode == 2 and "--out: empty; name a file" in empty.stderr


@pytest.mark.slow  # starts a process without root's overrides
def test_init_names_a_schema_it_cannot_read_or_that_is_no_file(tmp_path):
    assert run_main("init", cwd=tmp_path).returncode == 0
    (tmp_path / "ddpdeploy.yaml").unlink()
    schema = tmp_path / SCHEMA_FILE
    schema.chmod(0)
    code = "from ddpdeploy.cli import main; main(['init'])"
    try:
        res = subprocess.run(
            [*without_dac_override(schema), sys.executable, "-c", code], cwd=tmp_path,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        schema.chmod(0o644)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"error: cannot read {SCHEMA_FILE} (the JSON Schema init writes beside the spec); "
        "fix its permissions, or pass --force to replace it"
    )
    schema.unlink()
    os.mkfifo(schema)
    fifo = run_main("init", "--force", cwd=tmp_path)
    assert fifo.returncode == 2
    assert "it is not a regular file; move it away" in fifo.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["compose", "--out", "foo/"], "--out: 'foo/' names a folder; give a file path"),
        (["compose", "--out", "foo/."], "--out: 'foo/.' names a folder"),
        (["compose", "--out", "-/"], "--out: '-/' names a folder"),
        (["init", "s.yaml/"], "PATH: 's.yaml/' names a folder; give a file path"),
        (["init", "s.yaml/."], "PATH: 's.yaml/.' names a folder"),
        (["init", SCHEMA_FILE], f"{SCHEMA_FILE} is where init writes the JSON Schema"),
        (["init", "nodir/x.yaml"], "nodir is not a folder; create it first"),
    ],
)
def test_a_path_that_names_a_folder_writes_nothing(tmp_path, args, said):
    # `compose --out foo/` wrote a file foo; `init .ddpdeploy.schema.json` wrote the schema
    # and then refused, leaving it behind.
    (tmp_path / "ddpdeploy.yaml").write_text("image: a\n")
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddpdeploy.yaml"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("null: x\n", "(top level): a key that is null"),
        ("checkpoint: {~: x}\n", "checkpoint: a key that is null"),
        # Quoted twice before: "'\\x1b[31mshm_size'" in double quotes.
        ('"\\e[31mx": 1\n', "unknown field '\\x1b[31mx';"),
        ('checkpoint: {"claim\\u200bName": x}\n', "unknown field 'claim\\u200bName';"),
    ],
)
def test_odd_keys_are_named_once_and_plainly(tmp_path, text, said):
    message = refused(tmp_path, text)
    assert said in message and "Keys should be strings" not in message, message
    assert "\x1b" not in message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # "must be a valid string; quote it in YAML": quoting a mapping is no fix.
        ("imagePullSecrets:\n- name: regcred\n", "imagePullSecrets.0: must be text, not a map"),
        ("env: {A: {valueFrom: {secretKeyRef: {name: s, key: k}}}}\n", "goes under secretEnv"),
        ("nodeSelector: {a: [x]}\n", "nodeSelector.a: must be text, not a list"),
        ("env:\n- name: A\n  value: b\n", "env: must be a mapping NAME: value, e.g. {A: b}"),
        # "Field required" hid the key written instead.
        ("secretEnv: {A: {name: s, key: k}}\n", "secretEnv.A.secret: is required, and 'name'"),
    ],
)
def test_kubernetes_shapes_get_the_fix_that_fits(tmp_path, text, said):
    message = refused(tmp_path, text)
    assert said in message and "quote it" not in message, message


@pytest.mark.parametrize("value", ["", ",", "a b", "mlx5/0", "x:y:z", "[bold]x"])
def test_nccl_ib_hca_takes_adapters_only(tmp_path, value):
    message = refused(tmp_path, f"network: {{ncclIbHca: '{value}'}}\n")
    assert "is not an InfiniBand adapter (NAME or NAME:PORT)" in message, message


@pytest.mark.parametrize("value", ["mlx5_0", "mlx5_0,mlx5_1:1", "^=mlx5_0:1"])
def test_nccl_ib_hca_takes_nccls_own_syntax(tmp_path, value):
    taken(tmp_path, f"network: {{ncclIbHca: '{value}'}}\n")


@pytest.mark.parametrize("value", [".", ".."])
def test_nccl_socket_ifname_refuses_what_the_kernel_refuses(tmp_path, value):
    assert "is not a network interface name" in refused(
        tmp_path, f"network: {{ncclSocketIfname: '{value}'}}\n"
    )
