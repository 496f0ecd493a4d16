"""``--patch``: the changes of the combination as one unified diff the user applies to their own files.

Source changes are the edits the arms ran (``source_edits``). Runtime changes become code: the process
settings as lines at the start of the factory's body (``catalogue.Change.code``), the optimizer changes as a
``fused=True`` / ``foreach=True`` keyword on the ``torch.optim`` constructors of the factory's module, and what
has no one-line form (compiling modules, autocast) as a comment saying what was measured. Paths are relative
to the factory module's folder, ``a/NAME.py`` / ``b/NAME.py``: ``cd FOLDER && patch -p1 < OUT.diff`` (or
``git apply OUT.diff``).
"""

from __future__ import annotations

import ast
import difflib
import os
from pathlib import Path

from harness.trials.catalogue import CHANGES
from harness.trials.runtime_patches import OPTIMIZER_CLASSES
from harness.trials.source_edits import after_last_argument, alias_of, dotted_name, import_aliases, insert_at

MARK = "# rlgauge try:"
_COMMENTS = {
    "compile_modules": "call .compile() on each nn.Module once it is built (measured: every top-level module)",
    "autocast_bf16": "run the update's module calls under torch.autocast(device_type, dtype=torch.bfloat16) "
                     "(not acting under no_grad), their outputs cast back to float32, the optimizer step outside",
}


def runtime_lines(names: list[str], torch_name: str) -> list[str]:
    """The lines the runtime changes ``names`` add at the start of the factory (comments where no line does it)."""
    lines = []
    for name in names:
        change = CHANGES[name]
        lines += [f"{line.format(torch=torch_name)}  {MARK} {name}" for line in change.code]
        if name in _COMMENTS:
            lines.append(f"{MARK} {name}: {_COMMENTS[name]}")
    return lines


def optimizer_keywords(text: str, implementations: dict[str, str], mode: str) -> tuple[str, int]:
    """``fused=True`` (or ``foreach=True`` where the arm fell back to it, or ``mode`` is foreach) added to each
    ``torch.optim`` constructor in ``text`` that sets neither; (new text, calls edited)."""
    tree = ast.parse(text)
    aliases = import_aliases(tree)
    inserts = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = dotted_name(call.func, aliases) or ""
        cls = name.rpartition(".")[2]
        if not name.startswith("torch.optim.") or cls not in OPTIMIZER_CLASSES or not call.args:
            continue
        if {"fused", "foreach", None} & {k.arg for k in call.keywords}:
            continue
        keyword = "fused" if mode == "fused" and implementations.get(cls, "fused") == "fused" else "foreach"
        inserts.append((*after_last_argument(call), f", {keyword}=True"))
    return (insert_at(text, inserts), len(inserts)) if inserts else (text, 0)


def with_factory_lines(text: str, factory_attr: str, lines: list[str]) -> str:
    """``lines`` added at the start of the factory's body (after its docstring), or after the module's imports
    where the factory is not a plain function of the module; ``import torch`` first where the module has no torch."""
    if not lines:
        return text
    tree = ast.parse(text)
    if alias_of(tree, "torch") is None:
        lines = ["import torch", *lines]
    rows = text.splitlines(keepends=True)
    newline = "\r\n" if rows and rows[0].endswith("\r\n") else "\n"
    function = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == factory_attr), None)
    if function is not None:
        body = function.body
        first = body[1] if len(body) > 1 and _is_docstring(body[0]) else body[0]
        if first.lineno > function.lineno and not _is_docstring(first):
            at = first.lineno - 1
            indent = rows[at][:len(rows[at]) - len(rows[at].lstrip())]
            return "".join(rows[:at] + [f"{indent}{line}{newline}" for line in lines] + rows[at:])
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    at = max((n.end_lineno or n.lineno) for n in imports) if imports else 0
    return "".join(rows[:at] + [f"{line}{newline}" for line in lines] + rows[at:])


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def combined_files(names: list[str], edited: dict[Path, tuple[str, str]], factory_file: Path | None,
                   factory_attr: str, implementations: dict[str, str]) -> dict[Path, tuple[str, str]]:
    """The files the changes ``names`` touch: path -> (original, changed), the source edits and the runtime code."""
    files = dict(edited)
    runtime = [n for n in names if CHANGES[n].kind == "runtime" and n != "no_change"]
    if not runtime or factory_file is None:
        return files
    original, text = files.get(factory_file) or (factory_file.read_text(encoding="utf-8"),) * 2
    optimizer = next((n for n in runtime if n in ("fused_optimizer", "foreach_optimizer")), None)
    if optimizer is not None:
        text, count = optimizer_keywords(text, implementations, optimizer.split("_")[0])
        if count:
            runtime.remove(optimizer)
    lines = runtime_lines(runtime, alias_of(ast.parse(text), "torch") or "torch")
    if optimizer in runtime:
        lines.append(f"{MARK} {optimizer}: build the torch.optim optimizer with "
                     f"{'fused' if optimizer == 'fused_optimizer' else 'foreach'}=True")
    files[factory_file] = (original, with_factory_lines(text, factory_attr.split(".")[0], lines))
    return files


def unified_diff(files: dict[Path, tuple[str, str]], base: Path) -> str:
    """One diff of every changed file, paths relative to ``base`` as ``a/PATH`` and ``b/PATH``."""
    parts = []
    for path, (before, after) in sorted(files.items()):
        if before == after:
            continue
        relative = os.path.relpath(path, base).replace(os.sep, "/")
        lines = difflib.unified_diff(_lines(before), _lines(after), f"a/{relative}", f"b/{relative}")
        parts.append("".join(lines))
    return "".join(parts)


def _lines(text: str) -> list[str]:
    """Lines with their ends; a last line without one is marked as ``diff`` marks it."""
    rows = text.splitlines(keepends=True)
    if rows and not rows[-1].endswith("\n"):
        rows[-1] += "\n\\ No newline at end of file\n"
    return rows
