"""Reading specs: one YAML file per stream, parsed strictly into a validated :class:`StreamSpec`.

Every error names the spec file and the field (``outputs[1].query.group_by[0]``) so that an
operator can fix it without reading Spark's stack traces. The same strict YAML loader reads
every file the platform reads (the quality rules too): plain ``yaml.safe_load`` keeps the
last of two equal keys and drops the first without a word.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from spark_jobs.stream_spec.models import SpecError, StreamSpec
from spark_jobs.stream_spec.validation import field_problems, semantic_problems, shared_path_problems


class _DuplicateKey(yaml.YAMLError):
    pass


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key repeated in one mapping is an error.

    Plain YAML keeps the last of two equal keys and drops the first without a word: a
    second ``watermark:`` or ``outputs:`` pasted into a spec would silently win.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                seen = key in first
            except TypeError:  # an unhashable key: the base class says so
                continue
            if seen:
                raise _DuplicateKey(f"duplicate key {key!r} on line {key_node.start_mark.line + 1} "
                                    f"(first on line {first[key] + 1}); YAML would keep only the last")
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (PyYAML's own text quotes the line and a caret)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or problem is None:
        return str(exc)
    context = f"{exc.context}: " if getattr(exc, "context", None) else ""
    return f"{context}{problem} (line {mark.line + 1}, column {mark.column + 1})"


def parse_spec(data: Any, source: str | os.PathLike[str] = "<spec>") -> StreamSpec:
    """Validate already-loaded YAML data; raise :class:`SpecError` naming each field."""
    if not isinstance(data, dict):
        raise SpecError(source, [("", "a spec must be a YAML mapping")])
    try:
        spec = StreamSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, field_problems(exc)) from None
    problems = semantic_problems(spec) + shared_path_problems({str(source): spec}).get(str(source), [])
    if problems:
        raise SpecError(source, problems)
    return spec


def load_yaml(text: str) -> Any:
    """YAML's safe loader, except that a key repeated in one mapping raises a
    :class:`yaml.YAMLError` naming the key and both lines."""
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader


def load_spec(path: str | os.PathLike[str]) -> StreamSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, [("", f"cannot read: {exc}")]) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError(path, [("", f"not valid YAML: {yaml_problem(exc)}")]) from None
    spec = parse_spec(data, path)
    if spec.name != path.stem:
        raise SpecError(path, [("name", f"must match the file name {path.stem!r}")])
    return spec


def spec_files(directory: str | os.PathLike[str]) -> list[Path]:
    return sorted(p for p in Path(directory).glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def load_specs(directory: str | os.PathLike[str]) -> tuple[dict[str, StreamSpec], dict[str, SpecError]]:
    """Load every spec in a directory: the valid ones, and an error per invalid file.

    A spec that shares a checkpoint or sink path with another is invalid too (both
    are reported), so that nothing is deployed from it while the rest keep working.
    """
    specs: dict[str, StreamSpec] = {}
    errors: dict[str, SpecError] = {}
    for path in spec_files(directory):
        try:
            specs[str(path)] = load_spec(path)
        except SpecError as exc:
            errors[str(path)] = exc
    for source, problems in shared_path_problems(specs).items():
        errors[source] = SpecError(source, problems)
    for source in list(specs):
        if source in errors:
            del specs[source]
    return {s.name: s for s in specs.values()}, errors
