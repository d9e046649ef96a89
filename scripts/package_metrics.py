"""Issue 16's shape targets for fixed_replay, measured from the source.

Prints the module-level re-exports (`NAME = module.attr` of an imported
module, or a name imported from one of the package's modules and never used
by the importing one), the import cycles (any import, at module level or
inside a function, except those under `if TYPE_CHECKING:`), the share of
public functions and methods outside cli/ whose parameters and return are
all annotated (`__init__` needs no return annotation), and the lines by
kind: code, docstring (a module's, class's or function's first string),
blank and comment, as `wc -l` counts them, with the largest module.
Duplicates are measured with `duplicates --repo fixed_replay`.

Usage: python scripts/package_metrics.py [PACKAGE_DIR] [--verbose]
"""

import ast
import collections
import os
import sys


def _modules(root):
  """{dotted module name: path} of every .py file under root."""
  found = {}
  for directory, _, names in os.walk(root):
    for name in names:
      if name.endswith('.py'):
        path = os.path.join(directory, name)
        module = path[:-3].replace(os.sep, '.')
        found[module.removesuffix('.__init__')] = path
  return found


def _reexports(path, tree, modules):
  used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
  for node in tree.body:  # Names of our modules imported only to be read.
    if isinstance(node, ast.ImportFrom) and node.module in modules:
      for a in node.names:
        name = a.asname or a.name
        if f'{node.module}.{a.name}' not in modules and name not in used:
          yield f'{path}:{node.lineno} {name}'
  imported = set()
  for node in tree.body:
    if isinstance(node, ast.Import):
      imported.update((a.asname or a.name).split('.')[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      imported.update(a.asname or a.name for a in node.names)
  for node in tree.body:
    if (
      isinstance(node, ast.Assign)
      and len(node.targets) == 1
      and isinstance(node.targets[0], ast.Name)
      and isinstance(node.value, ast.Attribute)
      and isinstance(node.value.value, ast.Name)
      and node.value.value.id in imported
    ):
      yield f'{path}:{node.lineno} {node.targets[0].id}'


def _imports(module, path, tree, modules):
  """The package modules `module` imports at run time."""
  skipped = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
      skipped.update(id(inner) for inner in ast.walk(node))
  package = (
    module if path.endswith('__init__.py') else module.rpartition('.')[0]
  )
  for node in ast.walk(tree):
    if id(node) in skipped:
      continue
    targets = []
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      base = node.module
      if node.level:
        parts = package.split('.')[: len(package.split('.')) - node.level + 1]
        base = '.'.join(parts + [node.module])
      targets = [f'{base}.{a.name}' for a in node.names] + [base]
    for target in targets:
      while target and target not in modules:
        target = target.rpartition('.')[0]
      if target and target != module:
        yield target


def _cycles(graph):
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  sys.setrecursionlimit(10000)

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in list(graph):
    if v not in index:
      visit(v)
  return found


def _annotated(tree):
  """(public functions and methods, how many are fully annotated)."""
  total = annotated = 0
  bodies = [tree.body]
  while bodies:
    for node in bodies.pop():
      if isinstance(node, ast.ClassDef) and not node.name.startswith('_'):
        bodies.append(node.body)
      elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if node.name.startswith('_') and node.name != '__init__':
          continue
        arguments = node.args.posonlyargs + node.args.args
        arguments += node.args.kwonlyargs
        typed = all(
          a.annotation is not None
          for a in arguments
          if a.arg not in ('self', 'cls')
        )
        returns = node.returns is not None or node.name == '__init__'
        total += 1
        annotated += typed and returns
  return total, annotated


def _line_kinds(source, tree):
  """Counter of the code, docstring, blank and comment lines of a module."""
  lines = source.splitlines()
  kinds = ['blank' if not line.strip() else '' for line in lines]
  for node in ast.walk(tree):
    if (
      isinstance(
        node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
      )
      and ast.get_docstring(node, clean=False) is not None
    ):
      first = node.body[0]
      for i in range(first.lineno - 1, first.end_lineno):
        kinds[i] = 'docstring'
  return collections.Counter(
    kind or ('comment' if line.lstrip().startswith('#') else 'code')
    for kind, line in zip(kinds, lines, strict=True)
  )


def main(argv):
  root = next((a for a in argv[1:] if not a.startswith('-')), 'fixed_replay')
  verbose = '--verbose' in argv
  modules = _modules(root)
  graph = collections.defaultdict(set)
  reexports, total, annotated = [], 0, 0
  kinds, sizes = collections.Counter(), {}
  for module, path in sorted(modules.items()):
    with open(path) as stream:
      source = stream.read()
    tree = ast.parse(source)
    counted = _line_kinds(source, tree)
    kinds += counted
    sizes[path] = counted.total()
    reexports += _reexports(path, tree, modules)
    graph[module].update(_imports(module, path, tree, modules))
    graph[module].discard(root)
    if f'{os.sep}cli{os.sep}' not in path:
      counted = _annotated(tree)
      total += counted[0]
      annotated += counted[1]
  largest = max(sizes, key=sizes.get)
  print(
    f'lines: {kinds.total():,} in {len(sizes)} files ('
    + ', '.join(f'{kinds[k]:,} {k}' for k in ('code', 'docstring', 'blank'))
    + f', {kinds["comment"]:,} comment); largest: {largest} '
    f'({sizes[largest]})'
  )
  print(f're-exports: {len(reexports)}')
  if verbose:
    print('\n'.join(f'  {line}' for line in reexports))
  print(f'import cycles: {_cycles(graph) or "none"}')
  share = annotated / max(total, 1)
  print(f'annotated outside cli/: {annotated}/{total} = {share:.1%}')


if __name__ == '__main__':
  main(sys.argv)
