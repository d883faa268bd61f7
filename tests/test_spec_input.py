"""Spec files as users write them: text kept as typed, strict YAML, bounded reads, one line
for every refusal, and the API server's own limits checked before anything renders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runner import run_main

from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.errors import UserError
from ddpdeploy.spec import RESERVED_ENV, is_reserved_env

# Plain scalars that YAML 1.1 (PyYAML) reads as something other than the text typed.
TRICKY = ["1.10", "012", "0x1F", "0o17", "1:30", "1_000", "on", "yes", "off", "true", "0777"]
TRICKY += ["2024-01-01", ".inf", "-.5", "+1", "1e3", "1.0e-3", "0.50"]


def write(tmp_path: Path, text: str, name: str = "ddpdeploy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path | None, flags: dict | None = None, args: list[str] | None = None) -> str:
    with pytest.raises(UserError) as info:
        spec_from_flags(path, flags, args)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.exit_code == 2
    return message


@pytest.mark.parametrize("text", TRICKY)
def test_string_fields_keep_the_text_as_typed(tmp_path, text):
    doc = (
        f"command: {{args: [--tag, {text}]}}\nenv: {{SEED: {text}}}\n"
        f"annotations: {{example.com/v: {text}}}\n"
    )
    spec = spec_from_flags(write(tmp_path, doc))
    assert spec.command.args == ["--tag", text]
    assert spec.env == {"SEED": text}
    assert spec.annotations == {"example.com/v": text}


@pytest.mark.parametrize("text", ["1.10", "012", "0x1F", "true", "0777"])
def test_labels_and_node_selector_keep_text(tmp_path, text):
    spec = spec_from_flags(write(tmp_path, f"labels: {{v: {text}}}\nnodeSelector: {{v: {text}}}\n"))
    assert spec.labels == {"v": text} and spec.node_selector == {"v": text}


@pytest.mark.parametrize("text", ["4", "0.5", "012", "1.50"])
def test_quantities_keep_the_text_as_typed(tmp_path, text):
    assert spec_from_flags(write(tmp_path, f"cpu: {text}\n")).cpu == text


@pytest.mark.parametrize("text", ["0x10", "010", "1:30", "1_0", "+0x1"])
def test_counts_must_be_plain_decimal(tmp_path, text):
    message = refused(write(tmp_path, f"nodes: {text}\n"))
    assert f"ddpdeploy.yaml:1: nodes: write '{text}' as a plain decimal integer" in message
    nested = f"rendezvous:\n  mode: elastic\n  minNodes: 1\n  maxNodes: {text}\n"
    assert "ddpdeploy.yaml:4: rendezvous.maxNodes: write" in refused(write(tmp_path, nested))
    assert "runPolicy.backoffLimit: write" in refused(
        write(tmp_path, f"runPolicy: {{backoffLimit: {text}}}\n")
    )


@pytest.mark.parametrize("text", ["true", "yes", "2.0", "'2'", "1e2", "0o10"])
def test_counts_are_strict_integers(tmp_path, text):
    assert "nodes: must be a valid integer" in refused(write(tmp_path, f"nodes: {text}\n"))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: a\nnodes: 1\nname: b\n", "ddpdeploy.yaml:3: duplicate key 'name'"),
        ("env:\n  A: x\n  A: y\n", "ddpdeploy.yaml:3: duplicate key 'A'"),
        ("command: {args: [], args: [-x]}\n", "ddpdeploy.yaml:1: duplicate key 'args'"),
    ],
)
def test_duplicate_keys_are_refused(tmp_path, text, where):
    assert where in refused(write(tmp_path, text))


def test_aliases_merge_keys_and_deep_nesting_are_refused(tmp_path):
    assert "aliases" in refused(write(tmp_path, "a: &x [1]\ncommand: {args: *x}\n"))
    assert "merge keys" in refused(write(tmp_path, "env: {<<: {A: x}, A: y}\n"))
    deep = "env: " + "[" * 5000 + "]" * 5000 + "\n"
    assert "nested deeper than" in refused(write(tmp_path, deep))


# Every validator matches whole strings: a trailing newline (a `|` block) is refused.
NEWLINE_CASES = [
    ("name: |\n  abc\n", {}, "name:"),
    ("", {"--name": "abc\n"}, "--name:"),
    ("", {"--namespace": "team\n"}, "--namespace:"),
    ("", {"--image": "train:v1\n"}, "--image:"),
    ('cpu: "4\\n"\n', {}, "cpu:"),
    ('memory: "4Gi\\n"\n', {}, "memory:"),
    ('env: {"A\\n": x}\n', {}, "env name"),
    ('labels: {"team\\n": x}\n', {}, "label key"),
    ('labels: {team: "a\\n"}\n', {}, "label value"),
    ('nodeSelector: {team: "a\\n"}\n', {}, "label value"),
    ('annotations: {"a.b/c\\n": x}\n', {}, "annotation key"),
    ('checkpoint: {claimName: "c\\n"}\n', {}, "checkpoint.claimName"),
    ('checkpoint: {size: 1Gi, storageClass: "s\\n"}\n', {}, "checkpoint.storageClass"),
    ('imagePullSecrets: ["r\\n"]\n', {}, "imagePullSecrets"),
    ('serviceAccount: "t\\n"\n', {}, "serviceAccount"),
    ('command: {module: "m\\n"}\n', {}, "module"),
]


@pytest.mark.parametrize(("text", "flags", "expected"), NEWLINE_CASES)
def test_trailing_newline_is_refused_everywhere(tmp_path, text, flags, expected):
    assert expected in refused(write(tmp_path, text), flags)


def test_elastic_range_is_digits_only():
    assert "is not MIN:MAX" in refused(None, {"--elastic": "1:2\n"})
    assert "is not MIN:MAX" in refused(None, {"--elastic": "1:\u0663"})  # an Arabic-Indic 3
    assert "is not MIN:MAX" in refused(None, {"--elastic": "1:" + "9" * 5000})


BIG = 2**70
API_LIMITS = [
    ("", {"--nodes": 99999999999999999999999}, "--nodes: must be at most 100000"),
    ("", {"--gpus": 2**64}, "--gpus: must be at most 1024 GPUs per node"),
    ("", {"--procs": 2**40}, "--procs: must be at most 1024 processes per node"),
    ("", {"--elastic": f"1:{10**20}"}, "--elastic: must be at most 100000"),
    ("", {"--elastic": "1:2", "--max-restarts": 2**40}, "--max-restarts: must be less"),
    (f"terminationGracePeriodSeconds: {BIG}\n", {}, "terminationGracePeriodSeconds: must"),
    (f"runPolicy: {{activeDeadlineSeconds: {BIG}}}\n", {}, "activeDeadlineSeconds: must"),
    (f"runPolicy: {{backoffLimit: {2**31}}}\n", {}, "backoffLimit: must be less"),
    (f"rendezvous: {{joinTimeout: {2**31}}}\n", {}, "joinTimeout: must be less"),
    ("checkpoint: {claimName: c, mountPath: /dev/shm}\n", {}, "/dev/shm is where shmSize"),
    ("checkpoint: {claimName: c, mountPath: /dev//shm/}\n", {}, "/dev/shm is where shmSize"),
    ("checkpoint: {claimName: c, mountPath: /}\n", {}, "mountPath '/' would hide"),
    ("checkpoint: {claimName: c, mountPath: /a/../b}\n", {}, "without '..'"),
    # Found by the second hostile pass: accepted, and the pod could not find its script.
    ("checkpoint: {claimName: c, mountPath: /workspace}\n", {}, "would hide /workspace, where"),
    ("checkpoint: {claimName: c, mountPath: /opt/}\n", {}, "would hide /opt/ddpdeploy/train"),
    # Found by the fourth hostile pass: accepted; the pod could not start (no /bin/sh, no
    # python in the default base image's /opt/conda) or the runtime refused the mount.
    ("checkpoint: {claimName: c, mountPath: /usr}\n", {}, "would hide /usr/bin, which"),
    ("checkpoint: {claimName: c, mountPath: /opt/conda/}\n", {}, "would hide /opt/conda"),
    ("checkpoint: {claimName: c, mountPath: /etc}\n", {}, "would hide /etc, which"),
    ("checkpoint: {claimName: c, mountPath: /dev}\n", {}, "would hide /dev, which"),
    ("checkpoint: {claimName: c, mountPath: /proc/ck}\n", {}, "is in /proc, which the"),
    ("checkpoint: {claimName: c, mountPath: /sys}\n", {}, "is in /sys, which the"),
    # normpath keeps a leading "//": each is refused, not mounted over / or a clash rule's path
    ("checkpoint: {claimName: c, mountPath: '//'}\n", {}, "mountPath '/' would hide"),
    ("checkpoint: {claimName: c, mountPath: '///'}\n", {}, "mountPath '/' would hide"),
    (
        "checkpoint: {claimName: c, mountPath: //dev/shm}\n",
        {},
        "starts with '//'; write '/dev/shm'",
    ),
    ("checkpoint: {claimName: c, mountPath: //tmp}\n", {}, "starts with '//'; write '/tmp'"),
    ("checkpoint: {claimName: c, mountPath: //ckpt/}\n", {}, "starts with '//'; write '/ckpt'"),
    ("tolerations: [{key: a, operator: Exists, value: b}]\n", {}, "Exists takes no value"),
    ("tolerations: [{key: a, value: b, tolerationSeconds: 5}]\n", {}, "only to effect: NoEx"),
    ("tolerations: [{value: b}]\n", {}, "without a key needs operator: Exists"),
    ("tolerations: [{key: 'a b', operator: Exists}]\n", {}, "toleration key 'a b'"),
    ("tolerations: [{key: a, value: 'b c'}]\n", {}, "toleration value 'b c'"),
    ("nodeSelector: {'bad key': x}\n", {}, "label key 'bad key' is not a qualified name"),
    ("nodeSelector: {team: 'a b'}\n", {}, "label value 'a b' is invalid"),
    ("checkpoint: {size: 1Gi, storageClass: Fast_RWX}\n", {}, "checkpoint.storageClass"),
    ("labels: {" + "a" * 254 + "/team: x}\n", {}, "is not a qualified name"),
    ("annotations: {a/b: " + "x" * (256 * 1024) + "}\n", {}, "Kubernetes allows 256 KiB"),
    ("", {"--image": "r/" + "a" * 260 + ":v1"}, "longer than 255 characters"),
    ("", {"--image": "train@sha256:" + "a" * 63}, "digest sha256:"),
    ("", {"--image": "train@sha256:" + "A" * 64}, "digest sha256:"),
    ("", {"--image": "train@md5:" + "a" * 32}, "digest md5:"),
    ("", {"--image": "train:v\u00e9"}, "is not an image reference"),
    ("memory: 16\n", {}, "memory: '16' is 16 bytes; give a unit, e.g. 16Gi"),
    ("memory: 16m\n", {}, "memory: '16m' is 0.016 bytes"),
    ('shmSize: "0"\n', {}, "shmSize: '0' must be greater than zero"),
    ("checkpoint: {size: 0Gi}\n", {}, "checkpoint.size: '0Gi' must be greater than zero"),
    ("cpu: 0\n", {}, "cpu: '0' must be greater than zero"),
    ("cpu: 0.0001\n", {}, "below the smallest CPU unit"),
    ("command: {args: ['$(HOME)']}\n", {}, "command.args.0: '$(HOME)' contains '$('"),
    ("env: {A: 'x$$y'}\n", {}, "env.A: 'x$$y' contains"),
    ("command: {script: ''}\n", {}, "command.script"),
    ("command: {module: 'a b'}\n", {}, "is not a dotted Python module name"),
]


@pytest.mark.parametrize(("text", "flags", "expected"), API_LIMITS)
def test_what_the_api_server_refuses_is_refused_here(tmp_path, text, flags, expected):
    assert expected in refused(write(tmp_path, text), flags)


def test_dollar_rule_covers_args_after_double_dash(tmp_path):
    assert "contains '$('" in refused(None, {}, ["--run", "$(date)"])


@pytest.mark.parametrize(
    "name", sorted(RESERVED_ENV) + ["PET_NNODES", "TORCHELASTIC_X", "DDPDEPLOY_RDZV_HOST"]
)
def test_launch_contract_env_cannot_be_overridden(tmp_path, name):
    assert is_reserved_env(name)
    message = refused(write(tmp_path, f"env: {{{name}: '1'}}\n"))
    assert f"{name} is set by ddpdeploy's launch contract" in message


@pytest.mark.parametrize(
    "doc",
    [
        {"nodes": 2},
        {
            "nodes": 2,
            "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 3, "maxRestarts": 1},
        },
        {"nodes": 2, "target": "trainjob"},
        {"nodes": 2, "target": "indexed-job"},
    ],
)
def test_every_variable_the_contract_sets_is_reserved(doc):
    from ddpdeploy.spec import JobSpec
    from ddpdeploy.targets import launch_contract

    contract = launch_contract(JobSpec.model_validate(doc))
    names = {name for node in contract.nodes for name in contract.node_env(node)}
    assert names and [n for n in sorted(names) if not is_reserved_env(n)] == []


def test_ordinary_env_is_not_reserved():
    assert not any(map(is_reserved_env, ["NCCL_DEBUG", "OMP_NUM_THREADS", "PETS", "RANKING"]))


@pytest.mark.parametrize(
    ("text", "flags", "args", "expected"),
    [
        ("rendezvous: static\n", {"--elastic": "1:2"}, None, "rendezvous must be a mapping"),
        ("command: train.py\n", {}, ["--lr", "0.1"], "command must be a mapping"),
        ("command: {args: -x}\n", {}, ["--lr"], "command.args must be a list"),
        ("command: [ab]\n", {}, None, "command: must be a mapping of fields (got ['ab'])"),
        ("shm_size: 1Gi\n", {}, None, "unknown field 'shm_size'; keys are camelCase"),
        ("shm_size: 1Gi\n", {"--nodes": 2}, None, "'shmSize'"),
        ("rendezvous: {max_restarts: 1}\n", {"--elastic": "1:2"}, None, "'maxRestarts'"),
        ("command: {args: [a, ~]}\n", {}, None, "command.args.1: must be a valid string"),
    ],
)
def test_shape_errors_are_one_line(tmp_path, text, flags, args, expected):
    assert expected in refused(write(tmp_path, text), flags, args)


def test_files_that_are_not_regular_or_too_big_are_refused(tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    assert "Too many levels of symbolic links" in refused(tmp_path / "loop1")
    assert "/dev/zero is not a regular file" in refused(Path("/dev/zero"))
    os.mkfifo(tmp_path / "fifo")
    assert "fifo is not a regular file" in refused(tmp_path / "fifo")  # and does not block
    big = write(tmp_path, "# pad\n" * 200_000, "big.yaml")
    assert "big.yaml is larger than 1024 KiB" in refused(big)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    assert "is not UTF-8 text" in refused(bad)


@pytest.mark.parametrize("kind", ["directory", "dangling", "loop"])
def test_default_file_that_cannot_be_read_is_refused(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "ddpdeploy.yaml"
    if kind == "directory":
        target.mkdir()
    elif kind == "dangling":
        target.symlink_to(tmp_path / "nowhere.yaml")
    else:
        target.symlink_to(target)
    assert refused(None).startswith("./ddpdeploy.yaml: ")


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ("env: " + "[" * 5000 + "]" * 5000 + "\n", []),
        ("rendezvous: static\n", ["--elastic", "1:2"]),
        ("command: train.py\n", ["--", "--lr", "0.1"]),
        ("command: [ab]\n", []),
    ],
)
def test_cli_prints_one_line_and_writes_nothing(tmp_path, text, argv):
    write(tmp_path, text)
    result = run_main("render", "--image", "train:v1", *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddpdeploy.yaml"]


@pytest.mark.parametrize(
    "text",
    [
        "image: " + "a" * 500_000 + "\n",
        "memory: " + "1" * 500_000 + "\n",
        "a" * 500_000 + ": 1\n",
        "labels: {team: " + "a" * 500_000 + "}\n",
        "command: " + "a" * 500_000 + "\n",
        "nodes: 0x" + "1" * 500_000 + "\n",
    ],
)
def test_messages_stay_short_for_huge_values(tmp_path, text):
    args = ["x"] if text.startswith("command") else None
    assert len(refused(write(tmp_path, text), None, args)) < 400


def test_a_key_with_a_newline_is_named_on_one_line(tmp_path):
    # Found by tests/test_render_property.py: the key was printed raw, splitting the line.
    message = refused(write(tmp_path, 'secretEnv: {"x\\n": {}}\n'))
    assert message.startswith(f"{tmp_path / 'ddpdeploy.yaml'}: secretEnv.'x\\n'.secret: ")


def test_the_one_quantity_parser_is_exact():
    from decimal import Decimal

    from ddpdeploy.spec import quantity

    assert quantity("1Gi") == ("1Gi", Decimal(2**30), "Gi")
    assert quantity("500m")[1] == Decimal("0.5")
    assert quantity("1.5e3")[1] == 1500
    assert quantity(8)[1] == 8  # as the API may report a count
    assert quantity("0")[1] == 0  # zero is a quantity; the fields refuse it themselves
    assert quantity("1e99999999999")[1].is_infinite()  # no overflow error
    assert quantity("2E")[1] == 2 * 10**18  # exa, not an exponent without digits
    assert quantity("1Ei")[1] == 2**60
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        quantity("8 GPUs")


@pytest.mark.parametrize("text", ["1Ei", "2E"])
def test_exa_quantities_render(tmp_path, text):
    # Found by the second hostile pass: 'E' and 'Ei' were read as an exponent, the amount
    # was NaN, and comparing it raised decimal.InvalidOperation (a traceback).
    spec = spec_from_flags(write(tmp_path, f"image: a/b:1\nmemory: {text}\n"), None, None)
    assert spec.memory == text
