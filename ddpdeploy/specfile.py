"""Reading a spec file: bounded, strict YAML, and scalars kept as the user typed them.

PyYAML reads YAML 1.1, where `1.10`, `012`, `0x1F`, `1:30` and `on` are numbers or booleans
(1.1, 10, 31, 90, true). In a field that holds text (args, env values, labels, …) that would
change what the user wrote, so every plain scalar keeps its source text, and the model's field
types decide which one a position gets: the text where the field is a string, the number where
it is a count (spelled in plain decimal, else refused), the value elsewhere.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ddpdeploy.adapters.files import read_regular
from ddpdeploy.errors import UserError

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


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, aliases and deep nesting, and keeps text."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            # An alias can expand a small file into an exponentially large document.
            raise SpecSyntaxError(
                "anchors and aliases (*name) are not supported", _line(self.peek_event().start_mark)
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise SpecSyntaxError(
                    f"nested deeper than {MAX_DEPTH} levels", _line(self.peek_event().start_mark)
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

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
