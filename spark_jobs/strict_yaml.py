"""How the platform reads its own YAML files (stream specs, quality rules): one strict way.

Plain ``yaml.safe_load`` keeps the last of two equal keys and drops the first without a
word; a rules file with ``readings:`` pasted twice would silently lose the first set of
expectations. Every file the platform reads is parsed with the specs' loader instead.
"""

from __future__ import annotations

from typing import Any

import yaml

from spark_jobs.spec import _SpecLoader, _yaml_problem


def load_yaml(text: str) -> Any:
    """YAML's safe loader, except that a key repeated in one mapping raises a
    :class:`yaml.YAMLError` naming the key and both lines."""
    return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (line and column)."""
    return _yaml_problem(exc)
