"""Source changes at the lines a diagnosis found, made on a file's text with Python's ``ast`` (never on the
user's file: ``patched_copy`` writes the result into a temporary folder).

Each editor takes the text and a line number and returns the new text, or raises ``EditRefused`` with
the reason when the line is not one it can change safely: conservative by design (one tensor-making call
on the line, a single-line assignment, a distribution constructor). Every edit is re-parsed.
"""

from __future__ import annotations

import ast
from typing import Callable

import torch.distributions as distributions


class EditRefused(Exception):
    """The line cannot be edited safely; ``str`` says why."""


def _tree(text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise EditRefused(f"the file does not parse ({exc.msg}, line {exc.lineno})") from None


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level import names -> the module or object they bind (``np`` -> ``numpy``, ``Categorical`` ->
    ``torch.distributions.categorical.Categorical``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if getattr(node, "col_offset", 1) != 0:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def alias_of(tree: ast.Module, module: str) -> str | None:
    """The name ``module`` is imported under at module level (``torch``, ``th``), or None."""
    return next((name for name, bound in import_aliases(tree).items() if bound == module), None)


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``np.array`` -> ``numpy.array`` through the imports; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _calls_at(tree: ast.Module, line: int) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)]


def _keywords(call: ast.Call) -> set[str | None]:
    return {k.arg for k in call.keywords}


def _offset(lines: list[str], line: int, byte_col: int) -> tuple[int, int]:
    """An AST position (1-based line, UTF-8 byte column) as (0-based line, str index)."""
    text = lines[line - 1]
    return line - 1, len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def insert_at(text: str, positions: list[tuple[int, int, str]]) -> str:
    """``text`` with each ``(line, byte_col, snippet)`` inserted, the last position first."""
    lines = text.splitlines(keepends=True)
    for line, col, snippet in sorted(positions, reverse=True):
        row, index = _offset(lines, line, col)
        lines[row] = lines[row][:index] + snippet + lines[row][index:]
    return "".join(lines)


def after_last_argument(call: ast.Call) -> tuple[int, int]:
    last = max([*call.args, *call.keywords], key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
    return last.end_lineno or last.lineno, last.end_col_offset or 0


def _reparsed(text: str, what: str) -> str:
    try:
        ast.parse(text)
    except SyntaxError:
        raise EditRefused(f"{what} would not parse; edit the line by hand") from None
    return text


# --------------------------------------------------------------------------- float32 where float64 enters

_TORCH_MAKERS = ("torch.tensor", "torch.as_tensor")
_NUMPY_MAKERS = ("numpy.array", "numpy.asarray")


def float32_at_source(text: str, line: int) -> str:
    """The one call on ``line`` that makes an array from data without a dtype, made float32:
    ``torch.tensor(x)`` -> ``torch.tensor(x, dtype=torch.float32)``, ``torch.from_numpy(x)`` ->
    ``torch.from_numpy(x).float()``, ``np.array(x)`` -> ``np.array(x).astype(np.float32)``."""
    tree = _tree(text)
    aliases = import_aliases(tree)
    found = []
    for call in _calls_at(tree, line):
        name = dotted_name(call.func, aliases)
        if name is None or not call.args or {"dtype", None} & _keywords(call):
            continue
        if name in (*_TORCH_MAKERS, "torch.from_numpy", *_NUMPY_MAKERS):
            found.append((call, name))
    if len(found) != 1:
        what = "no call that makes a tensor from data without a dtype" if not found else \
            f"{len(found)} calls that make tensors from data"
        raise EditRefused(f"line {line} has {what}; edit it by hand")
    call, name = found[0]
    if name in _TORCH_MAKERS:
        torch_name = _base_name(call.func) if isinstance(call.func, ast.Attribute) else alias_of(tree, "torch")
        if torch_name is None:
            raise EditRefused(f"line {line}: torch is not imported under a name in the module; edit it by hand")
        end_line, end_col = after_last_argument(call)
        new = insert_at(text, [(end_line, end_col, f", dtype={torch_name}.float32")])
    elif name == "torch.from_numpy":
        new = insert_at(text, [(call.end_lineno or line, call.end_col_offset or 0, ".float()")])
    else:
        numpy_name = _base_name(call.func) if isinstance(call.func, ast.Attribute) else alias_of(tree, "numpy")
        if numpy_name is None:
            raise EditRefused(f"line {line}: numpy is not imported under a name in the module; edit it by hand")
        new = insert_at(text, [(call.end_lineno or line, call.end_col_offset or 0, f".astype({numpy_name}.float32)")])
    return _reparsed(new, f"the float32 edit of line {line}")


def _base_name(func: ast.Attribute) -> str | None:
    node = func.value
    while isinstance(node, ast.Attribute):
        node = node.value
    return ast.unparse(func.value) if isinstance(node, ast.Name) else None


# --------------------------------------------------------------------------- distribution checks off

def _is_distribution(name: str | None) -> bool:
    if name is None:
        return False
    cls = getattr(distributions, name.rpartition(".")[2], None)
    return isinstance(cls, type) and issubclass(cls, distributions.Distribution)


def validate_args_off(text: str, line: int) -> str:
    """``validate_args=False`` added to every distribution constructor on ``line`` that does not set it."""
    tree = _tree(text)
    aliases = import_aliases(tree)
    calls = [c for c in _calls_at(tree, line) if c.lineno == line or c.end_lineno == line]
    found = [c for c in calls if _is_distribution(dotted_name(c.func, aliases))
             and not {"validate_args", None} & _keywords(c) and (c.args or c.keywords)]
    if not found:
        raise EditRefused(f"line {line} builds no torch.distributions distribution without validate_args "
                          "(the check may run in a method of one built elsewhere)")
    new = insert_at(text, [(*after_last_argument(call), ", validate_args=False") for call in found])
    return _reparsed(new, f"the validate_args edit of line {line}")


# --------------------------------------------------------------------------- acting under no_grad

def no_grad_acting(text: str, line: int) -> str:
    """The single-line assignment on ``line`` wrapped in ``with torch.no_grad():`` at its indentation."""
    tree = _tree(text)
    torch_name = alias_of(tree, "torch")
    if torch_name is None:
        raise EditRefused(f"line {line}: torch is not imported under a name in the module; edit it by hand")
    lines = text.splitlines(keepends=True)
    source = lines[line - 1]
    indent = source[:len(source) - len(source.lstrip())]
    starting = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == line]
    if len(starting) != 1 or not isinstance(starting[0], (ast.Assign, ast.AnnAssign)):
        raise EditRefused(f"line {line} is not a single assignment statement; edit it by hand")
    statement = starting[0]
    if statement.end_lineno != line or _offset(lines, line, statement.col_offset)[1] != len(indent):
        raise EditRefused(f"line {line}: the assignment does not stand alone on its line; edit it by hand")
    if any(isinstance(n, ast.stmt) and n is not statement and not hasattr(n, "body")
           and n.lineno <= line <= (n.end_lineno or n.lineno) for n in ast.walk(tree)):
        raise EditRefused(f"line {line} holds more than one statement; edit it by hand")
    unit = "\t" if "\t" in indent else "    "
    newline = "\r\n" if source.endswith("\r\n") else "\n"
    lines[line - 1] = f"{indent}with {torch_name}.no_grad():{newline}{indent}{unit}{source.lstrip()}"
    return _reparsed("".join(lines), f"the no_grad edit of line {line}")


EDITORS: dict[str, Callable[[str, int], str]] = {
    "float32_at_source": float32_at_source, "validate_args_off": validate_args_off, "no_grad_acting": no_grad_acting}
"""The source changes, by name (``catalogue``)."""

_LAST_ON_A_LINE = ("no_grad_acting",)
"""Edits that add a line above theirs: made after the others on the same line."""


def apply_edits(text: str, edits: list[tuple[str, int]]) -> str:
    """``text`` with every ``(change, line)`` edit made: the highest line first so the line numbers below hold,
    and on one line the edits that add a line above it last."""
    for change, line in sorted(edits, key=lambda e: (-e[1], e[0] in _LAST_ON_A_LINE)):
        text = EDITORS[change](text, line)
    return text
