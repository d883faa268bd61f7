"""Loading a JobSpec: reading the file, merging overrides and args, one-line errors.

Reading is bounded, strict YAML with scalars kept as the user typed them.

PyYAML reads YAML 1.1, where `1.10`, `012`, `0x1F`, `1:30` and `on` are numbers or booleans
(1.1, 10, 31, 90, true). In a field that holds text (args, env values, labels, …) that would
change what the user wrote, so every plain scalar keeps its source text, and the model's field
types decide which one a position gets: the text where the field is a string, the number where
it is a count (spelled in plain decimal, else refused), the value elsewhere.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from ddpdeploy.errors import UserError
from ddpdeploy.fs import read_regular
from ddpdeploy.paths import DEFAULT_FILE
from ddpdeploy.spec.model import JobSpec
from ddpdeploy.text import reads_as_zero, show

MAX_BYTES = 1024 * 1024  # a job spec is a few hundred bytes; anything near this is a mistake
MAX_DEPTH = 32  # the deepest real spec nests 4 levels (tolerations: - key:)
_DECIMAL = r"[-+]?(0|[1-9][0-9]*)"
OVERSIZED = "<a number too long to convert>"


@dataclass(frozen=True)
class Plain:
    """A plain scalar YAML resolved to a non-string: its value and the text as written."""

    value: Any
    text: str
    line: int


class SpecSyntaxError(Exception):
    """A document ddpdeploy refuses to read: message plus its 1-based line."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def _line(mark: yaml.Mark | None) -> int | None:
    return mark.line + 1 if mark else None


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, aliases and deep nesting, and keeps text."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def _mark_line(self) -> int | None:
        # types-PyYAML leaves peek_event untyped.
        return _line(self.peek_event().start_mark)  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            # An alias can expand a small file into an exponentially large document.
            raise SpecSyntaxError(
                "anchors and aliases (*name) are not supported", self._mark_line()
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise SpecSyntaxError(f"nested deeper than {MAX_DEPTH} levels", self._mark_line())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        value = super().construct_scalar(node)
        # "\ud800" in a quoted string is not a character: YAML and JSON output would write
        # it differently (U+FFFD, or an escape strict parsers refuse).
        if isinstance(value, str) and (found := _SURROGATE.search(value)):
            raise SpecSyntaxError(
                f"U+{ord(found[0]):04X} is half of a UTF-16 surrogate pair, not a character; "
                "write the character itself (or its \\U00XXXXXX escape)",
                _line(node.start_mark),
            )
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                # `<<:` lets a merged key hide an explicit one without a word.
                raise SpecSyntaxError(
                    "merge keys (<<) are not supported", _line(key_node.start_mark)
                )
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise SpecSyntaxError(
                        f"duplicate key {key_node.value[:80]!r} "
                        "(YAML would keep only the last one)",
                        _line(key_node.start_mark),
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _keep_text(tag: str) -> None:
    base = _Loader.yaml_constructors[tag]

    def construct(loader: _Loader, node: yaml.ScalarNode) -> Plain:
        try:
            value = base(loader, node)
        except ValueError:  # more digits than Python converts; fine where text is wanted
            value = OVERSIZED
        return Plain(value, node.value, node.start_mark.line + 1)

    _Loader.add_constructor(tag, construct)


for _tag in ("bool", "int", "float", "timestamp"):
    _keep_text(f"tag:yaml.org,2002:{_tag}")


def read_text(path: Path, label: str) -> str:
    """The file's text, refusing anything but a regular UTF-8 file of at most MAX_BYTES."""
    data = read_regular(path, label, MAX_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{label}: {path} is not UTF-8 text (byte {exc.start})") from None


def parse(text: str) -> Any:
    """The YAML document with plain non-string scalars as `Plain` (SpecSyntaxError, YAMLError)."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


# Kinds of position: text (a string field), int, bool, a model, ("list", kind), ("map", kind).
TEXT, INT, BOOL, ANY = "text", "int", "bool", "any"


def kind_of(annotation: Any) -> Any:
    """What a field annotation holds, as far as reading the file is concerned."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return kind_of(args[0])
    if origin in (Union, types.UnionType):
        kinds = [kind_of(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else ANY
    if origin is Literal:
        return TEXT if all(isinstance(a, str) for a in args) else ANY
    if origin is list:
        return ("list", kind_of(args[0]))
    if origin is dict:
        return ("map", kind_of(args[1]))
    if annotation is str:
        return TEXT
    if annotation is bool:
        return BOOL
    if annotation is int:
        return INT
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    return ANY


def resolve(node: Any, kind: Any, where: str = "") -> Any:
    """Replace every `Plain` in ``node`` by what the position ``kind`` expects.

    Raises SpecSyntaxError for a count not in plain decimal or a yes/on boolean."""
    if isinstance(node, Plain):
        return _scalar(node, kind, where)
    if isinstance(node, list):
        item = kind[1] if isinstance(kind, tuple) and kind[0] == "list" else ANY
        return [resolve(v, item, f"{where}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, dict):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            name = key.text if isinstance(key, Plain) else key
            out[name] = resolve(value, _child_kind(kind, name), f"{where}.{name}".lstrip("."))
        return out
    return node


def _child_kind(kind: Any, key: Any) -> Any:
    if isinstance(kind, tuple) and kind[0] == "map":
        return kind[1]
    if isinstance(kind, type) and hasattr(kind, "model_fields"):
        for name, field in kind.model_fields.items():
            if (field.alias or name) == key:
                return kind_of(field.annotation)
    return ANY


def _scalar(node: Plain, kind: Any, where: str) -> Any:
    if kind == TEXT:
        return node.text
    if node.value is OVERSIZED:
        raise SpecSyntaxError(
            f"{where}: a number of {len(node.text)} digits is out of range", node.line
        )
    if isinstance(node.value, float) and reads_as_zero(node.text, node.value):
        raise SpecSyntaxError(
            f"{where}: {node.text[:40]!r} is too small a number (it reads as 0)", node.line
        )
    is_int = isinstance(node.value, int) and not isinstance(node.value, bool)
    if kind == INT and is_int and not re.fullmatch(_DECIMAL, node.text):
        raise SpecSyntaxError(
            f"{where}: write {node.text[:40]!r} as a plain decimal integer "
            "(YAML 1.1 and 1.2 readers differ on what it means)",
            node.line,
        )
    if kind == BOOL and node.text not in ("true", "false"):
        raise SpecSyntaxError(f"{where}: write true or false, not {node.text[:40]!r}", node.line)
    return node.value


def read_spec_file(path: Path, label: str = "-f/--file") -> dict[str, Any]:
    """The spec document in ``path``: strict YAML, string fields as typed, as a plain dict.

    ``label`` names where the path came from in errors (the flag, or the default file)."""
    try:
        text = read_text(path, label)
    except FileNotFoundError:
        raise UserError(
            f"{label}: {path} not found; create one with `ddpdeploy init` or pass -f PATH"
        ) from None
    try:
        data = resolve(parse(text), JobSpec)
    except SpecSyntaxError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise UserError(f"{where}: {exc}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; no mark
        before = text[: exc.position]
        where = f"{path}:{before.count(chr(10)) + 1}:{len(before.rsplit(chr(10), 1)[-1]) + 1}"
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise UserError(
            f"{where}: YAML syntax error: character U+{code:04X} is not allowed in YAML; remove "
            f'it, or write it as an escape in a double-quoted string ("\\u{code:04x}")'
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of fields (name: …, nodes: …)")
    return data


def _section(doc: dict[str, Any], key: str, source: str, hint: str) -> dict[str, Any]:
    """A copy of the mapping at ``doc[key]`` that flags or args are merged into."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{source}: {key} must be a mapping, e.g. {hint} (got {show(value)})")
    return dict(value)


_HINTS = {
    "rendezvous": "{mode: static}",
    "command": "{script: train.py, args: [--lr, '0.1']}",
    "scheduling": "{scheduler: volcano}",
    "network": "{policy: true}",
    "security": "{readOnlyRootFilesystem: true}",
    "diagnostics": "{probe: true}",
}


def spec_file(path: Path | None = None) -> Path | None:
    """The file `load_spec` reads for ``path``: ``path``, else ./ddpdeploy.yaml when there is
    one, else None (the defaults)."""
    # lexists: a directory, a dangling link or a loop named ddpdeploy.yaml is refused, not
    # silently skipped.
    if path is None and os.path.lexists(DEFAULT_FILE):
        return Path(DEFAULT_FILE)
    return path


def _default_document() -> tuple[dict[str, Any], str]:
    if spec_file() is not None:
        return read_spec_file(Path(DEFAULT_FILE), f"./{DEFAULT_FILE}"), DEFAULT_FILE
    return {}, "defaults"


@dataclass(frozen=True)
class Override:
    """One value set over the file's (a CLI flag's): ``label`` names it in errors, ``path``
    is where it goes in the document (a section's mapping when ``convert`` returns one)."""

    label: str
    path: tuple[str, ...]
    value: Any
    convert: Callable[[Any], Any] | None = None  # applied when merged (may raise UserError)


def load_spec(
    path: Path | None = None,
    overrides: Sequence[Override] = (),
    extra_args: list[str] | None = None,
) -> JobSpec:
    """File (if any), then overrides (they win), then args after ``--``: one validated JobSpec.

    With no path, ``./ddpdeploy.yaml`` is read when it exists, else the defaults apply.
    Overrides come from the CLI's flags (options.py, which knows their spellings).
    """
    if path is not None:
        doc, source = read_spec_file(path), str(path)
    else:
        doc, source = _default_document()
    for override in overrides:
        key = override.path[0]
        value = override.convert(override.value) if override.convert else override.value
        if len(override.path) == 1 and not isinstance(value, dict):
            doc[key] = value
            continue
        section = _section(doc, key, source, _HINTS[key])
        if len(override.path) == 1:
            section.update(value)  # a flag that sets several fields of one section
        else:
            section[override.path[1]] = value
        doc[key] = section
    if extra_args:
        command = _section(doc, "command", source, _HINTS["command"])
        args = command.get("args") or []
        if not isinstance(args, list):
            raise UserError(f"{source}: command.args must be a list, e.g. [--lr, '0.1']")
        command["args"] = [*args, *extra_args]
        doc["command"] = command
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise UserError(_one_line(exc, source, overrides)) from None


def spec_with(spec: JobSpec, patch: Mapping[str, Any] | None = None, /, **changes: Any) -> JobSpec:
    """``spec`` changed and validated again as a whole, like a spec from a file
    (``model_copy(update=...)`` would skip every check: name budgets, ranges). The one way
    the package changes a spec.

    ``patch``: file keys (camelCase), nested mappings merged into the spec's; ``changes``:
    top-level fields (snake_case), replaced. An invalid result is one UserError line naming
    the field."""
    doc = _merge(spec.model_dump(mode="json", by_alias=True, exclude_unset=True), patch or {})
    doc.update({to_camel(k): v for k, v in changes.items()})
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise UserError(_one_line(exc, "defaults", ())) from None


def _merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _field_names(loc: Sequence[Any]) -> set[str]:
    """The field names (as spelled in the file) of the model at ``loc``: a hint offers only
    a real one (`foo_bar` must not send the user on to an unknown `fooBar`)."""
    kind: Any = JobSpec
    for key in loc:
        if isinstance(key, int):  # an item of a list
            kind = kind[1] if isinstance(kind, tuple) and kind[0] == "list" else ANY
        else:
            kind = _child_kind(kind, key)
    if not (isinstance(kind, type) and hasattr(kind, "model_fields")):
        return set()
    return {field.alias or name for name, field in kind.model_fields.items()}


def _meant(loc: Sequence[Any]) -> str | None:
    """The real field an unknown key at ``loc`` is a misspelling of, by case and separators
    (`shm_size`, `shm-size`, `ShmSize`: shmSize), or None."""
    folded = re.sub(r"[-_\s]", "", str(loc[-1])).casefold()
    names = {re.sub(r"[-_\s]", "", n).casefold(): n for n in _field_names(loc[:-1])}
    meant = names.get(folded)
    return meant if meant != loc[-1] else None


def _one_line(exc: ValidationError, source: str, overrides: Sequence[Override]) -> str:
    """The first error as one line, naming the override (flag) when one set that field;
    an unknown key that misspells a field comes first (its field's "Field required" says
    less)."""
    errors = exc.errors(include_url=False)
    misspelt = [e for e in errors if e["type"] == "extra_forbidden" and _meant(e["loc"])]
    first = misspelt[0] if misspelt else errors[0]
    # A key with a newline or other control character is shown quoted: one line stays one.
    loc = [str(p) if str(p).isprintable() else show(str(p)) for p in first["loc"]]
    prefix = "" if source == "defaults" else f"{source}: "
    where = f"{prefix}{'.'.join(loc)}" if loc else source
    for override in overrides:
        # The error sits on the flag's field, inside it, or on the model holding it.
        n = min(len(loc), len(override.path))
        if loc and tuple(loc[:n]) == override.path[:n]:
            where = override.label
            break
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        key = show(str(first["loc"][-1]))  # quoted once (loc quotes only what is unprintable)
        message = f"unknown field {key}; `ddpdeploy init` writes a file listing every field"
        if meant := _meant(first["loc"]):
            message = f"unknown field {key}; keys are camelCase like Kubernetes': {show(meant)}"
        where = f"{prefix}{'.'.join(loc[:-1]) or '(top level)'}"
    elif first["type"] == "invalid_key" and first.get("input") is None:  # `null: x`, `~: x`
        message = "a key that is null (`~`, `null` or empty); name the field, or quote it"
        where = f"{prefix}{'.'.join(loc[:-1]) or '(top level)'}"
    elif first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = f"must be a mapping of fields (got {show(first['input'])})"
        if loc in (["env"], ["secretEnv"]) and isinstance(first["input"], list):
            message = "must be a mapping NAME: value, e.g. {A: b}, not Kubernetes' list"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    else:
        message = message.replace("Input should be", "must be")
        if "input" in first and not isinstance(first["input"], dict | list):
            message += f" (got {show(first['input'])})"
    if first["type"] == "string_type" and isinstance(first.get("input"), dict | list):
        # Kubernetes' own shapes (`- name: regcred`, `valueFrom:`): quoting is no fix.
        kind = "a mapping" if isinstance(first["input"], dict) else "a list"
        message = f"must be text, not {kind}"
        if loc and loc[0] == "env":
            message += "; a Secret's value goes under secretEnv: {NAME: {secret: s, key: k}}"
        elif loc and loc[0] == "imagePullSecrets":
            message += "; give the Secret's name, e.g. imagePullSecrets: [regcred]"
    elif first["type"] == "string_type":
        message += "; quote it in YAML"
    if first["type"] == "missing":
        strays = [
            e["loc"][-1]
            for e in errors
            if e["type"] == "extra_forbidden" and e["loc"][:-1] == first["loc"][:-1]
        ]
        stray = f", and {show(str(strays[0]))} is no field here" if strays else ""
        message = f"is required{stray}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if where == "defaults":
        return f"{message}{more}"
    return f"{where}: {message}{more}"
