"""The documentation: the site builds strictly, and its examples run.

`mkdocs build --strict` must pass with no warning (a broken link, a nav
entry without a page, a docstring naming a parameter the signature lacks).

Every fenced ```bash and ```python block in README.md and docs/ is an
example a reader may paste, so each one runs here, in a fresh process, unless
an HTML comment just above it (invisible on the rendered page) says
otherwise:

  <!-- docs-test: skip REASON -->   illustrative: not run (needs the network,
                                    a cluster or hours); REASON is required
                                    and the page's text must say so too.
  <!-- docs-test: file NAME -->     not run: written to NAME (after any sub),
                                    for the blocks after it (a module, a gin
                                    file).
  <!-- docs-test: sub OLD NEW -->   replace OLD by NEW before running (e.g. a
                                    local stand-in for a bucket); OLD must
                                    occur in the block.
  <!-- docs-test: tiny -->          `fixed-replay train` and `python -m
                                    fixed_replay.train` in the block get
                                    tiny-budget gin bindings appended.
  <!-- docs-test: same PAGE -->     not run here: PAGE runs the same block
                                    (same text, same `tiny`), and every file
                                    this page writes before it, under the
                                    same name with the same text; checked.

The blocks of one page run in order in one temporary directory (so a page
may generate data, then convert and train on it), which holds links to the
repository's configs/ and examples/ so that `--gin_files=configs/dqn.gin`
and `python examples/NAME.py` work as they do in a clone. $DATA names a
directory of tiny datasets made once per session:
$DATA/Pong/1/replay_logs and $DATA/Pong/2/replay_logs (two checkpoints of
real Pong each, Dopamine's files) and $RLU_MIRROR a local copy, laid out
like RL Unplugged's bucket, of two shards of real Breakout; $BATCH_RL a
stand-in for a batch_rl checkout holding its five config files
(tests/data/batch_rl_configs/).
"""

import concurrent.futures
import dataclasses
import os
import pathlib
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

# One xdist worker runs the pages, so the session's tiny datasets ($DATA,
# $RLU_MIRROR: fresh processes that play real games) are made once.
pytestmark = pytest.mark.xdist_group('docs')

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted(
  [ROOT / 'README.md'] + list((ROOT / 'docs').rglob('*.md')),
  key=lambda p: str(p.relative_to(ROOT)),
)
RUNNABLE = ('bash', 'python')
BLOCK_TIMEOUT_S = 600

# Appended to every `train` of a block marked `tiny`: one short iteration.
TINY_TRAIN = [
  '--gin_bindings=FixedReplayRunner.num_iterations = 1',
  '--gin_bindings=FixedReplayRunner.training_steps = 20',
  '--gin_bindings=FixedReplayRunner.evaluation_steps = 20',
  '--gin_bindings=FixedReplayRunner.max_steps_per_episode = 20',
]

# Shell functions a `tiny` block runs under: the commands as printed, with
# the tiny budget after the printed flags (later gin bindings win).
_TINY_PRELUDE = """
TINY_TRAIN=({tiny})
fixed-replay() {{
  if [ "${{1:-}}" = train ]; then
    command fixed-replay "$@" "${{TINY_TRAIN[@]}}"
  else
    command fixed-replay "$@"
  fi
}}
python() {{
  if [ "${{1:-}}" = -m ] && [ "${{2:-}}" = fixed_replay.train ]; then
    command python "$@" "${{TINY_TRAIN[@]}}"
  else
    command python "$@"
  fi
}}
"""

_FENCE = re.compile(r'^(\s*)```(\S*)\s*$')
_DIRECTIVE = re.compile(r'^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$')


@dataclasses.dataclass
class Block:
  page: str
  line: int
  lang: str
  code: str
  skip: str | None = None
  file: str | None = None
  subs: list = dataclasses.field(default_factory=list)
  tiny: bool = False
  same: str | None = None

  @property
  def where(self):
    return f'{self.page}:{self.line}'


def parse(path):
  """The fenced blocks of a Markdown file, with their directives."""
  lines = path.read_text().splitlines()
  page = str(path.relative_to(ROOT))
  blocks, pending, i = [], [], 0
  while i < len(lines):
    directive = _DIRECTIVE.match(lines[i])
    fence = _FENCE.match(lines[i])
    if directive:
      pending.append(directive.group(1))
      i += 1
      continue
    if not fence:
      if lines[i].strip():
        pending = []
      i += 1
      continue
    lang = fence.group(2)
    start, i = i + 1, i + 1
    while i < len(lines) and lines[i].strip() != '```':
      i += 1
    code = textwrap.dedent('\n'.join(lines[start:i])) + '\n'
    block = Block(page, start, lang, code)
    for text in pending:
      kind, _, rest = text.partition(' ')
      if kind == 'skip':  # The reason is prose: taken as it is.
        block.skip = rest.strip()
        continue
      args = shlex.split(rest)
      if kind == 'file':
        (block.file,) = args
      elif kind == 'sub':
        old, new = args
        block.subs.append((old, new))
      elif kind == 'tiny':
        block.tiny = True
      elif kind == 'same':
        (block.same,) = args
      else:
        raise ValueError(f'{page}:{start}: unknown docs-test directive {text}')
    pending = []
    blocks.append(block)
    i += 1
  return blocks


def _runs(block):
  return (
    block.lang in RUNNABLE
    and block.skip is None
    and block.file is None
    and block.same is None
  )


def _heavy(blocks):
  """Whether a page's examples train (or play) for more than a few seconds."""
  return any(
    _runs(b) and re.search(r'\btrain\b|\bgenerate\b|FixedReplayRunner', b.code)
    for b in blocks
  )


def _page_params():
  params = []
  for path in PAGES:
    blocks = parse(path)
    if not any(_runs(b) for b in blocks):
      continue
    marks = [pytest.mark.slow] if _heavy(blocks) else []
    page = str(path.relative_to(ROOT))
    params.append(pytest.param(page, marks=marks, id=page))
  return params


def test_site_builds_strictly(tmp_path):
  """`mkdocs build --strict` as a user runs it: any warning fails it.

  Not with -q, which drops warnings before strict mode counts them.
  """
  site = tmp_path / 'site'
  result = subprocess.run(
    [sys.executable, '-m', 'mkdocs', 'build', '--strict', '-d', site],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env=_env(),
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert 'WARNING ' not in result.stdout + result.stderr, result.stderr
  cli_page = (site / 'reference' / 'cli' / 'index.html').read_text()
  _assert_every_flag_listed(cli_page)
  buffers = (site / 'reference' / 'buffers' / 'index.html').read_text()
  for argument in ('data_dir', 'replay_suffix', 'num_buffers_to_load'):
    assert argument in buffers, argument


def _help_flags(command):
  """The flag names `fixed-replay COMMAND --help` prints."""
  result = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', command, '--help'],
    capture_output=True,
    text=True,
    env=_env(),
    timeout=120,
    check=False,
  )
  names = re.findall(r'^\s+--(?:\[no\])?([a-z_0-9]+)', result.stdout, re.M)
  assert names, (command, result.stdout, result.stderr)
  return names


def _assert_every_flag_listed(cli_page):
  """Every flag `fixed-replay CMD --help` prints is on the CLI page."""
  from fixed_replay import cli

  with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    names = list(pool.map(_help_flags, cli.SUBCOMMANDS))
  helps = dict(zip(cli.SUBCOMMANDS, names, strict=True))
  for command, names in helps.items():
    assert f'fixed-replay {command}' in cli_page, command
    for name in names:
      assert f'--{name}' in cli_page, f'fixed-replay {command} --{name}'


def test_every_example_is_run_or_says_why():
  """A bash or python block not run says why (skip REASON) or is a file."""
  seen = 0
  for path in PAGES:
    for block in parse(path):
      if block.lang not in RUNNABLE:
        continue
      seen += 1
      if block.skip is not None:
        assert block.skip.strip(), f'{block.where}: skip without a reason'
      for old, _ in block.subs:
        assert old in block.code, f'{block.where}: sub {old!r} not in block'
  assert seen > 10


def _files_before(blocks, block):
  """{name: text} of the files a page writes before `block` runs."""
  files = {}
  for earlier in blocks[: blocks.index(block)]:
    if earlier.file is not None:
      files[earlier.file] = _substituted(earlier)
  return files


def test_a_block_run_elsewhere_is_the_same_there():
  """A `same PAGE` block is run there as it is printed here, on the files
  printed here."""
  checked = 0
  for path in PAGES:
    blocks = parse(path)
    for block in blocks:
      if block.same is None:
        continue
      target = parse(ROOT / block.same)
      twins = [
        b
        for b in target
        if _runs(b) and b.code == block.code and b.tiny == block.tiny
      ]
      assert twins, f'{block.where}: no such block runs on {block.same}'
      theirs = _files_before(target, twins[0])
      for name, text in _files_before(blocks, block).items():
        assert (
          theirs.get(name) == text
        ), f'{block.where}: {name} differs on {block.same}'
      checked += 1
  assert checked


def test_readme_is_short():
  assert len((ROOT / 'README.md').read_text().splitlines()) <= 250


def test_no_closed_bucket_in_runnable_examples():
  """gs://atari-replay-datasets is closed: no example reads it."""
  for path in PAGES:
    for block in parse(path):
      assert 'gs://atari-replay-datasets' not in block.code, block.where


def _env(**extra):
  env = dict(os.environ)
  bin_dir = os.path.dirname(sys.executable)
  env['PATH'] = bin_dir + os.pathsep + env.get('PATH', '')
  env['PYTHONPATH'] = os.pathsep.join(
    [str(ROOT)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
  )
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  env['NO_MKDOCS_2_WARNING'] = '1'
  env.update(extra)
  return env


@pytest.fixture(scope='session')
def docs_data(tmp_path_factory):
  """$DATA: two tiny Dopamine-written runs of real Pong.

  Made in this process (which has TensorFlow already): setup, not an
  example, so it needs no fresh process of its own.
  """
  from fixed_replay.generate import generate

  data = tmp_path_factory.mktemp('docs_data')
  run_1 = data / 'Pong' / '1' / 'replay_logs'
  generate.generate_dataset(
    str(run_1),
    game='Pong',
    num_checkpoints=2,
    checkpoint_rows=1000,
    progress=False,
  )
  shutil.copytree(run_1, data / 'Pong' / '2' / 'replay_logs')
  return data


@pytest.fixture(scope='session')
def rlu_mirror(tmp_path_factory):
  """$RLU_MIRROR: two shards of real Breakout, laid out like the bucket."""
  import rlu_data

  directory = tmp_path_factory.mktemp('rlu_mirror') / 'Breakout'
  directory.mkdir()
  episodes = rlu_data.play(4, max_steps=150)
  for number in range(2):
    first = number * len(episodes)  # episode_idx runs on across the run
    shard = [
      rlu_data.relabel(e, number, first + i) for i, e in enumerate(episodes)
    ]
    rlu_data.write_shard(rlu_data.shard_path(directory, 1, number, 50), shard)
  return directory.parent


@pytest.fixture(scope='session')
def batch_rl_checkout(tmp_path_factory):
  """$BATCH_RL: batch_rl's five config files where a checkout has them."""
  batch_rl = tmp_path_factory.mktemp('batch_rl_checkout')
  shutil.copytree(
    ROOT / 'tests' / 'data' / 'batch_rl_configs',
    batch_rl / 'batch_rl' / 'fixed_replay' / 'configs',
  )
  return batch_rl


_FIXTURES = {
  'DATA': 'docs_data',
  'RLU_MIRROR': 'rlu_mirror',
  'BATCH_RL': 'batch_rl_checkout',
}


def _substituted(block):
  code = block.code
  for old, new in block.subs:
    code = code.replace(old, new)
  return code


def _script(block):
  code = _substituted(block)
  if block.lang == 'python':
    return code
  prelude = 'set -euo pipefail\n'
  if block.tiny:
    tiny = ' '.join(shlex.quote(flag) for flag in TINY_TRAIN)
    prelude += _TINY_PRELUDE.format(tiny=tiny)
  return prelude + code


@dataclasses.dataclass
class BlockRun:
  """What one example printed and left."""

  block: Block
  returncode: int
  stdout: str
  stderr: str

  def explain(self):
    return (
      f'{self.block.where} exited {self.returncode}\n--- block\n'
      f'{self.block.code}--- stdout\n{self.stdout[-4000:]}\n--- stderr\n'
      f'{self.stderr[-6000:]}'
    )


@dataclasses.dataclass
class PageRun:
  """A page's examples, run in order in `work` until one fails."""

  work: pathlib.Path
  runs: list


def _run_page(page, request, tmp_path):
  """Runs a page's examples in order, each in a fresh process."""
  text = (ROOT / page).read_text()
  extra = {'HOME': str(tmp_path)}
  for variable, fixture in _FIXTURES.items():
    if '$' + variable in text:  # Made only for the pages that use it.
      extra[variable] = str(request.getfixturevalue(fixture))
  work = tmp_path / 'work'
  work.mkdir()
  (work / 'configs').symlink_to(ROOT / 'configs')
  (work / 'examples').symlink_to(ROOT / 'examples')
  env = _env(**extra)
  page_run = PageRun(work, [])
  for index, block in enumerate(parse(ROOT / page)):
    if block.skip is not None or block.same is not None:
      continue
    if block.file is not None:  # A file of any kind (.py, .gin, ...).
      (work / block.file).write_text(_substituted(block))
      continue
    if block.lang not in RUNNABLE:
      continue
    script = (
      tmp_path / f'block_{index}.{"py" if block.lang == "python" else "sh"}'
    )
    script.write_text(_script(block))
    command = [sys.executable if block.lang == 'python' else 'bash', script]
    result = subprocess.run(
      command,
      cwd=work,
      env=env,
      capture_output=True,
      text=True,
      timeout=BLOCK_TIMEOUT_S,
      check=False,
    )
    page_run.runs.append(
      BlockRun(block, result.returncode, result.stdout, result.stderr)
    )
    if result.returncode:
      break
  return page_run


@pytest.fixture(scope='session')
def page_runs(request, tmp_path_factory):
  """get(page): the page's PageRun, its examples run once per session.

  The examples' own runs are also what the tests of the recipes they show
  check (test_own_agent_recipe_*), rather than running them again.
  """
  done = {}

  def get(page):
    if page not in done:
      tmp_path = tmp_path_factory.mktemp('page')
      done[page] = _run_page(page, request, tmp_path)
    return done[page]

  return get


@pytest.mark.parametrize('page', _page_params())
def test_examples_run(page, page_runs):
  """Every example of the page runs, in order, each in a fresh process."""
  page_run = page_runs(page)
  for run in page_run.runs:
    assert run.returncode == 0, run.explain()
  assert page_run.runs


# ------------------------------------- the "Your own agent" recipes' runs

# The guide's two recipes, run above as a reader runs them (the TF agent
# through `fixed-replay train`, the JAX one through its own train_mine.py),
# on $DATA/Pong/1 (Dopamine-written Pong, so `train` finds the game in the
# path). These tests check what those runs did; they are the core tier's
# successful training commands in a fresh process.
OWN_AGENT_PAGE = 'docs/guides/your-own-agent.md'
# recipe: (a text only its command holds, its base_dir in the work dir,
# the agent class).
RECIPES = {
  'tf': ('my_agents:MyDQNAgent', 'runs/mine', 'MyDQNAgent'),
  'jax': ('python train_mine.py', 'runs/mine_jax', 'MyJaxDQNAgent'),
}


def _recipe(page_runs, recipe):
  """(BlockRun, base_dir) of the guide's command for `recipe`."""
  marker, base_dir, _ = RECIPES[recipe]
  page_run = page_runs(OWN_AGENT_PAGE)
  (run,) = [r for r in page_run.runs if marker in r.block.code]
  assert base_dir in run.block.code, run.block.where
  return run, page_run.work / base_dir


@pytest.mark.parametrize('recipe', list(RECIPES))
def test_own_agent_recipe_trains_evaluates_and_checkpoints(page_runs, recipe):
  run, base_dir = _recipe(page_runs, recipe)
  agent = RECIPES[recipe][2]
  assert run.returncode == 0, run.explain()
  stderr = run.stderr  # absl logs to stderr.
  assert 'Traceback' not in stderr
  assert 'after the config was locked' not in stderr
  assert 'Iteration 0 (1/1) done' in stderr
  assert 'eval return' in stderr and 'ETA' in stderr
  with open(base_dir / 'logs' / 'log_0', 'rb') as f:
    logged = pickle.load(f)['iteration_0']
  assert logged['eval_episode_returns'], logged
  assert logged['train_average_steps_per_second'][0] > 0, logged
  checkpoints = set(os.listdir(base_dir / 'checkpoints'))
  assert {'ckpt.0', 'sentinel_checkpoint_complete.0'} <= checkpoints
  if recipe == 'tf':
    assert 'tf_ckpt-0.index' in checkpoints, checkpoints
  assert f'Training {agent} ({agent}) offline from ' in stderr
  assert 'will not train' not in stderr
  # FixedReplayBuffer.num_buffers_to_load = 5 took effect: $DATA has 2.
  assert 'num_buffers_to_load=5 but' in stderr
  # The agent's own loss reached the runner's per-iteration mean.
  losses = [k for k in logged if k.startswith('train_average_') and 'oss' in k]
  assert losses, sorted(logged)


def test_own_tf_agent_recipe_evaluates_in_the_datas_game(page_runs):
  run, _ = _recipe(page_runs, 'tf')
  # No game is bound: the data's path, $DATA/Pong/1, names it.
  assert "Evaluating in Pong, the data's game" in run.stderr, run.explain()


# ----------------------------- batch_rl's rem.gin, as the guide runs it

BATCH_RL_PAGE = 'docs/guides/coming-from-batch-rl.md'


@pytest.mark.slow
def test_batch_rl_rem_config_runs_unchanged(page_runs):
  """batch_rl's rem.gin, byte for byte ($BATCH_RL holds tests/data's), in
  the guide's `python -m fixed_replay.train` (test_dropin.py runs batch_rl's
  other four files the same way)."""
  from test_dropin import GPU_FALLBACK
  from test_dropin import Run
  from test_dropin import _assert_trained_evaluated_checkpointed

  page_run = page_runs(BATCH_RL_PAGE)
  (block_run,) = [r for r in page_run.runs if '/rem.gin' in r.block.code]
  assert '--base_dir=runs/rem_pong' in block_run.block.code
  run = Run(block_run, page_run.work / 'runs' / 'rem_pong')
  _assert_trained_evaluated_checkpointed(run)
  # batch_rl's transform_strategy chooses the method; the log says which.
  assert 'Training REM (FixedReplayMultiHeadDQNAgent) offline' in run.log
  # tf_device='/gpu:0' on this CPU machine: built on the CPU, said once.
  assert run.log.count(GPU_FALLBACK) == 1, run.log[-3000:]
