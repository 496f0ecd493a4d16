"""Import directions of the diagnose/try code: ``try`` and ``diagnose`` share ``cli.diagnose_spec`` (no circle between
their command modules), and ``diagnosis`` never imports ``trials`` (trials build on a diagnosis, not the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_try_command_does_not_import_the_analysis_commands() -> None:
    imported = _imports(ROOT / "harness" / "cli" / "try_command.py")
    assert not any(name.startswith("harness.cli.analysis_commands") for name in imported)
    assert "harness.cli.diagnose_spec" in imported


def test_the_diagnosis_package_never_imports_the_trials() -> None:
    for path in (ROOT / "harness" / "diagnosis").glob("*.py"):
        assert not any(name.startswith("harness.trials") for name in _imports(path)), path.name
