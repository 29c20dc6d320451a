"""How ``%%resumable`` becomes ordinary cell code: an input transformer plus an AST transformer.

A classic cell magic cannot ``await`` its body inside ipykernel and swallows its exceptions, so
the magic line is rewritten *before* IPython looks for ``%%`` magics, into a marker call that
carries the arguments and the cell's source; the AST transformer then wraps the rest of the
module in ``with __caravanserai_cell__(...) as __caravanserai_c__:``. The body keeps its line
numbers (errors point at the user's lines), top-level ``await`` keeps working, and the last
expression is displayed as in a normal cell. Both transformers are cheap and never raise
(IPython drops an AST transformer that raises).
"""

from __future__ import annotations

import ast

MARKER = "__caravanserai_marker__"
FACTORY = "__caravanserai_cell__"
INSTANCE = "__caravanserai_c__"
MAGIC = "%%resumable"


def cleanup(lines: list[str]) -> list[str]:
    """Input transformer: ``%%resumable ARGS`` → ``MARKER('ARGS', 'body source')`` on line 1."""
    if not lines or not lines[0].startswith(MAGIC) or lines[0][len(MAGIC):len(MAGIC) + 1] not in (" ", "\n", ""):
        return lines
    args = lines[0][len(MAGIC):].strip()
    body = "".join(lines[1:])
    return [f"{MARKER}({args!r}, {body!r})\n", *lines[1:]]


class _Assigned(ast.NodeVisitor):
    """Names bound at the cell's top level (not inside def/class/lambda/comprehension scopes)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def _add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self._add(node.id)

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._add(node.name)  # type: ignore[attr-defined]
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        pass

    def _comprehension(self, node: ast.AST) -> None:  # targets are local, but := leaks out
        for inner in ast.walk(node):
            if isinstance(inner, ast.NamedExpr) and isinstance(inner.target, ast.Name):
                self._add(inner.target.id)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            self._add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_MatchAs(self, node: ast.AST) -> None:
        if getattr(node, "name", None):
            self._add(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.AST) -> None:
        if getattr(node, "name", None):
            self._add(node.name)  # type: ignore[attr-defined]

    def visit_MatchMapping(self, node: ast.AST) -> None:
        if getattr(node, "rest", None):
            self._add(node.rest)  # type: ignore[attr-defined]
        self.generic_visit(node)


def assigned_names(statements: list[ast.stmt]) -> list[str]:
    visitor = _Assigned()
    for statement in statements:
        visitor.visit(statement)
    return visitor.names


def _simple_targets(statement: ast.stmt) -> list[str] | None:
    """Names a plain top-level assignment binds (``x = ...``, ``x: T = ...``, ``x += ...``), else None."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)) and getattr(statement, "value", None) is not None:
        targets = [statement.target]
    else:
        return None
    names = []
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
            elif not isinstance(node, (ast.Tuple, ast.List, ast.Store, ast.Starred, ast.Load)):
                return None  # attribute/subscript targets mutate objects: always run them
    return names or None


def _call(name: str, *args: ast.expr, **keywords: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(INSTANCE, ast.Load()), name, ast.Load()), list(args),
                    [ast.keyword(k, v) for k, v in keywords.items()])


class WrapCell(ast.NodeTransformer):
    """Wraps a marked cell's body: ``with FACTORY(args, source, names, assignments) as INSTANCE: ...``."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        try:
            return self._wrap(node)
        except Exception:  # never let IPython drop this transformer; the marker call then fails loudly
            return node

    def _wrap(self, node: ast.Module) -> ast.Module:
        body = node.body
        marker = body[0] if body else None
        if not (isinstance(marker, ast.Expr) and isinstance(marker.value, ast.Call)
                and getattr(marker.value.func, "id", None) == MARKER):
            return node
        call = marker.value
        statements = body[1:]
        names = assigned_names(statements)
        assignments: dict[int, list[str]] = {}
        wrapped: list[ast.stmt] = []
        for index, statement in enumerate(statements):
            at = ast.Expr(_call("at", ast.Constant(index)))
            ast.copy_location(at, statement)
            if index == len(statements) - 1 and isinstance(statement, ast.Expr):
                # keep the last expression's value for display after the block
                statement = ast.copy_location(ast.Assign(
                    [ast.Attribute(ast.Name(INSTANCE, ast.Load()), "result", ast.Store())], statement.value), statement)
            targets = _simple_targets(statement)
            if targets is not None:
                assignments[index] = targets
                guard = ast.If(_call("keep", ast.Constant(index)), [statement], [])
                statement = ast.copy_location(guard, statement)
            wrapped.extend([at, statement])
        run_body = ast.If(ast.Attribute(ast.Name(INSTANCE, ast.Load()), "execute", ast.Load()), wrapped or [ast.Pass()], [])
        factory = ast.Call(
            ast.Name(FACTORY, ast.Load()), list(call.args),
            # a Constant holds a tuple of constants at runtime (compile() folds tuples so); typeshed omits it
            [ast.keyword("names", ast.Constant(tuple(names))),  # type: ignore[arg-type]
             ast.keyword("assignments",
                         ast.Constant(tuple((k, tuple(v)) for k, v in assignments.items())))],  # type: ignore[arg-type]
        )
        block = ast.With([ast.withitem(factory, ast.Name(INSTANCE, ast.Store()))], [run_body])
        shown = ast.Expr(ast.Attribute(ast.Name(INSTANCE, ast.Load()), "shown", ast.Load()))
        for new in (run_body, block):
            ast.copy_location(new, marker)
        ast.copy_location(shown, statements[-1] if statements else marker)
        node.body = [block, shown]
        ast.fix_missing_locations(node)
        return node
