"""A YAML reader (JSON is YAML) that remembers where each value was written, so that every
mistake in a file is named `file:line: path: message`, whether found while reading it or by a
server whose problem document names the field; and the matching writer.

The file is composed into nodes (yaml.compose) and built here, not by PyYAML's constructor, so
that every mapping key and sequence item keeps its line, and a key given twice in one mapping
is an error (PyYAML keeps the last one silently). Plain scalars follow YAML 1.2's core schema,
as JSON reads them, not PyYAML's YAML 1.1 default: `on`, `yes` and `no` stay strings (a chain's
`after: {on: failure}` must not become `{True: failure}`), `010` is ten, `1e3` a number, and a
timestamp stays the text written (the API parses RFC 3339 itself). `<<` merges work as YAML
says: the mapping's own keys win over merged ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# A value's place in the document: mapping keys and sequence indexes from the root.
Path = tuple[str | int, ...]

_TAG = "tag:yaml.org,2002:"
_NULL, _BOOL, _INT, _FLOAT, _STR = (_TAG + name for name in ("null", "bool", "int", "float", "str"))
_MERGE, _MAP, _SEQ = _TAG + "merge", _TAG + "map", _TAG + "seq"
# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), and `<<`.
_CORE_SCHEMA = (
    (_NULL, r"^(?:~|null|Null|NULL|)$", "~nN"),
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (_INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        _FLOAT,
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$",
        "-+.0123456789",
    ),
    (_MERGE, r"^(?:<<)$", "<"),
)


class _CoreSchemaLoader(yaml.SafeLoader):
    # Its own resolvers (the core schema's, below), none of the YAML 1.1 ones SafeLoader has.
    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 (typeshed declares it an instance variable)


class _Dumper(yaml.SafeDumper):
    """Quotes every string that YAML 1.1 or 1.2 would read as something else, so what it
    writes reads back the same here and in other YAML tools."""


def _represent_text(dumper: _Dumper, text: str) -> ScalarNode:
    # U+0085, U+2028 and U+2029 break lines in YAML: written plain or single-quoted, they
    # would read back as spaces. Double quotes escape them.
    style = '"' if any(breaks in text for breaks in "\x85\u2028\u2029") else None
    return dumper.represent_scalar(_STR, text, style=style)


_Dumper.add_representer(str, _represent_text)
for _tag, _pattern, _first in _CORE_SCHEMA:
    _CoreSchemaLoader.add_implicit_resolver(_tag, re.compile(_pattern), [*_first, *([""] if _tag == _NULL else [])])
    _Dumper.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


@dataclass(frozen=True)
class FileError:
    """One mistake in a file: where (line, when known) and which value (`path`), and why."""

    line: int | None
    path: str
    message: str

    def text(self, file_name: str) -> str:
        """`schedules.yaml:12: schedules.nightly-report.cron: <message>`."""
        where = file_name if self.line is None else f"{file_name}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class FileErrors(Exception):
    """The file cannot be used as it is; every mistake found, in the order of the file."""

    def __init__(self, errors: list[FileError]) -> None:
        super().__init__(f"{len(errors)} error(s)")
        self.errors = sorted(errors, key=lambda error: error.line or 0)


_FIELD_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def path_text(path: Path) -> str:
    """("schedules", "nightly", "after", "job_id") -> `schedules.nightly.after.job_id`; items as `[i]`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def field_path(field_name: str) -> Path:
    """An API's field name as a path: `after.job_id` -> ("after", "job_id"), `jobs[3]` -> ("jobs", 3)."""
    return tuple(int(index) if index else name for name, index in _FIELD_PART.findall(field_name))


@dataclass(frozen=True)
class Document:
    """A file's data, and the line (1-based) each value's key or item was written on."""

    value: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        """The line of `path`, else of the nearest enclosing value written in the file."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None

    def error(self, path: Path, message: str) -> FileError:
        return FileError(self.line_of(path), path_text(path), message)

    def mappings(self, path: Path, keyed: str, errors: list[FileError]) -> dict[str, dict[str, Any]]:
        """The mapping of mappings at `path` (none when absent or null); `errors` gets its
        mistakes, and the entries that are no mappings are left out."""
        entries: Any = self.value
        for part in path:
            entries = entries.get(part) if isinstance(entries, dict) else None
        if entries is None:
            return {}
        if not isinstance(entries, dict):
            errors.append(self.error(path, f"must be a mapping, {keyed}"))
            return {}
        wrong = [name for name, fields in entries.items() if not isinstance(fields, dict)]
        errors += [self.error((*path, name), "must be a mapping of fields") for name in wrong]
        return {name: fields for name, fields in entries.items() if name not in wrong}

    def problem_errors(self, problem: dict[str, Any], path_of: Callable[[str], Path]) -> list[FileError]:
        """An RFC 9457 problem's field errors (`errors`, else its `field`) as mistakes of this
        file in its order, each at the path `path_of` gives its field: the line of the field
        when the file states it, else of the nearest value around it that the file does."""
        reported = problem.get("errors")
        if not isinstance(reported, list):
            reported = [{"field": problem["field"]}] if problem.get("field") else []
        errors = [
            self.error(path_of(str(error["field"])), str(error.get("message") or problem.get("detail") or "refused"))
            for error in reported
            if isinstance(error, dict) and error.get("field")
        ]
        return sorted(errors, key=lambda error: error.line or 0)


def load_document(text: str, errors: list[FileError] | None = None) -> Document:
    """The one document `text` holds. Text that is not YAML raises FileErrors; other mistakes
    (a key given twice: its first value is kept) are added to `errors`, or raised without it."""
    if _is_json(text):
        # No raw tab may stand inside a JSON string, so every tab is whitespace: YAML's
        # scanner refuses tabs there, JSON allows them (json.dumps(indent="\t")).
        text = text.replace("\t", " ")
    try:
        root = yaml.compose(text, Loader=_CoreSchemaLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        raise FileErrors([FileError(line, "", f"not YAML: {exc.problem or exc.context}")]) from None
    except yaml.YAMLError as exc:
        raise FileErrors([FileError(None, "", f"not YAML: {exc}")]) from None
    if root is None:
        return Document(None, {(): 1})
    builder = _Builder()
    value = builder.value(root, ())
    if errors is not None:
        errors.extend(builder.errors)
    elif builder.errors:
        raise FileErrors(builder.errors)
    return Document(value, builder.lines)


def dump(data: Any) -> str:
    """YAML text that load_document reads back as `data` (block style, keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)


def _is_json(text: str) -> bool:
    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass
class _Builder:
    """Builds Python values from nodes, recording lines and collecting errors."""

    lines: dict[Path, int] = field(default_factory=dict)
    errors: list[FileError] = field(default_factory=list)
    # An alias is the node of its anchor: built once (`&a` used a thousand times stays cheap).
    _built: dict[int, Any] = field(default_factory=dict)
    _building: set[int] = field(default_factory=set)

    def _error(self, node: Node, path: Path, message: str) -> None:
        self.errors.append(FileError(node.start_mark.line + 1, path_text(path), message))

    def value(self, node: Node, path: Path) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in self._built:
            return self._built[id(node)]
        if id(node) in self._building:
            self._error(node, path, "an alias refers to the value that holds it")
            return None
        self._building.add(id(node))
        if isinstance(node, MappingNode):
            built: Any = self._mapping(node, path)
        elif isinstance(node, SequenceNode):
            if node.tag != _SEQ:
                self._error(node, path, f"the tag {node.tag} is not supported: the file holds JSON data")
            built = [self.value(item, (*path, index)) for index, item in enumerate(node.value)]
        else:
            assert isinstance(node, ScalarNode)
            built = self._scalar(node, path)
        self._building.discard(id(node))
        self._built[id(node)] = built
        return built

    def _mapping(self, node: MappingNode, path: Path) -> dict[str, Any]:
        if node.tag != _MAP:
            self._error(node, path, f"the tag {node.tag} is not supported: the file holds JSON data")
        own: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged = self._merged(value_node, path) | merged
                continue
            key = self._scalar(key_node, path) if isinstance(key_node, ScalarNode) else None
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                self._error(key_node, path, "a key must be a string (as in JSON)")
                continue
            if key in first_line:
                self._error(key_node, (*path, key), f"given twice (first on line {first_line[key]})")
                continue
            first_line[key] = line
            self.lines[(*path, key)] = line
            own[key] = self.value(value_node, (*path, key))
        return merged | own

    def _merged(self, node: Node, path: Path) -> dict[str, Any]:
        """`<<: *base` or `<<: [*a, *b]`: the keys merged in, an earlier mapping's winning."""
        sources = node.value if isinstance(node, SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for source in reversed(sources):
            if not isinstance(source, MappingNode):
                self._error(source, path, "`<<` merges mappings only")
                continue
            merged |= self.value(source, path)
        return merged

    def _scalar(self, node: ScalarNode, path: Path) -> Any:
        text: str = node.value
        try:
            if node.tag == _STR:
                return text
            if node.tag == _NULL:
                return None
            if node.tag == _BOOL:
                return text.lower() == "true"
            if node.tag == _INT:
                digits = text.lstrip("+-")
                base = 8 if digits.startswith("0o") else 16 if digits.startswith("0x") else 10
                number = int(digits[2:] if base != 10 else digits, base)
                return -number if text.startswith("-") else number
            if node.tag == _FLOAT:
                special = text.lower().lstrip("+-")
                if special in (".inf", ".nan"):
                    return (-math.inf if text.startswith("-") else math.inf) if special == ".inf" else math.nan
                return float(text)
        except ValueError:
            self._error(node, path, f"{text!r} is not a valid {node.tag.removeprefix(_TAG)}")
            return None
        self._error(node, path, f"the tag {node.tag} is not supported: the file holds JSON data")
        return None
