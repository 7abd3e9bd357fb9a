"""The documentation: it builds with warnings as errors, its API reference covers the public
namespace, its lists of parts and partitioners name every registered one, its guides' code runs as
written, and no file outside tests/ points outside the repository."""

import ast
import pathlib
import re
import subprocess
import sys
import zlib

import pytest

from tests.hang_guard import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parent.parent
GUIDES = sorted((REPO / "docs" / "guides").glob("*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site built by `mkdocs build --strict` (any warning fails the build)."""
  out = tmp_path_factory.mktemp("site")
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                         str(out)], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return out


def documented(site) -> set[str]:
  """Every object the API reference documents, from the site's inventory (objects.inv)."""
  raw = (site / "objects.inv").read_bytes()
  body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
  return {line.split()[0] for line in body.splitlines()}


def public_definitions():
  """(module, name) of every top-level public definition of every module, and every name of the
  packages' `__all__`."""
  for path in sorted((REPO / "fedjax_sel").rglob("*.py")):
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        names = [node.name]
      elif isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
      elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        names = [node.target.id]
      else:
        continue
      for name in names:
        if name == "__all__":
          yield from ((module, n) for n in ast.literal_eval(node.value))
        elif not name.startswith("_"):
          yield module, name


def test_docs_build_strictly_and_the_api_reference_covers_every_public_name(site):
  names = documented(site)
  missing = [f"{m}.{n}" for m, n in public_definitions() if f"{m}.{n}" not in names]
  assert not missing, missing
  exported = [n for m, n in public_definitions() if m == "fedjax_sel" and n[0].isupper()]
  assert "Simulator" in exported and "fedjax_sel.Simulator" in names


def test_every_page_is_in_the_nav_and_every_paper_page_shows_its_figure():
  config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
  pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
  assert pages == set(re.findall(r":\s+(\S+\.md)$", config, re.M))
  for paper in ("filfl", "fedalign", "uacs", "fedsrc"):
    text = (REPO / "docs" / "papers" / f"{paper}.md").read_text(encoding="utf-8")
    figures = re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)\n\n\*Drawn by `python -m experiments",
                         text)
    assert figures and all((REPO / "docs" / "papers" / f).exists() for f in figures), paper


def between(page: str, start: str, end: str) -> str:
  """The text of docs/`page` from `start` up to the first `end` after it."""
  text = (REPO / "docs" / page).read_text(encoding="utf-8")
  return text[text.index(start):text.index(end, text.index(start))]


def has_word(text: str, name: str) -> bool:
  """Whether `text` holds `name` as a word of its own (not part of `selection.md` or `--a_b`)."""
  return re.search(rf"(?<![\w./-]){name}(?![\w/-])", text) is not None


def test_the_docs_name_every_registered_part_and_partitioner():
  from fedjax_sel import registry  # pylint: disable=import-outside-toplevel
  from fedjax_sel.data.partition import PARTITIONS  # pylint: disable=import-outside-toplevel
  # The package's own parts: a test module imported by this worker may have registered its own.
  names = lambda kind: [n for n in registry.names(kind)
                        if registry.lookup(kind, n).factory.__module__.startswith("fedjax_sel.")]
  vocabulary = between("workflow.md", "**One vocabulary.**", "The library's factories")
  unnamed = [f"workflow.md: {kind} {name}" for kind in registry.KINDS
             for name in names(kind) if f"`{name}`" not in vocabulary]
  selectors = between("papers/beyond.md", "**Selectors**", "**Filters**")
  unnamed += [f"papers/beyond.md: selector {name}" for name in names("selector")
              if not has_word(selectors, name)]
  for page, start, end in (("guides/data.md", "partitions it with", "usable on your own"),
                           ("data.md", "## Partitioners", "## Bad clients")):
    section = between(page, start, end)
    unnamed += [f"{page}: partition {name}" for name in PARTITIONS
                if not has_word(section, name)]
  assert not unnamed, unnamed


@pytest.mark.parametrize("page", GUIDES, ids=[p.stem for p in GUIDES])
def test_guide_code_runs_as_written(page, tmp_path, monkeypatch, capsys):
  blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
  assert blocks
  monkeypatch.chdir(tmp_path)
  exec(compile("\n".join(blocks), str(page), "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
  assert capsys.readouterr().out.strip()  # Every guide prints what it shows.


def test_no_file_outside_tests_points_outside_the_repository():
  files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
  pattern = re.compile(r"\.\./shared|SPEC\.md|SPEC section|PERF_NOTES\.md")
  offenders = []
  for name in files:
    path = REPO / name
    if name.startswith("tests/") or not path.is_file() or path.suffix in (".png", ".pdf"):
      continue
    text = path.read_text(encoding="utf-8", errors="ignore")
    offenders += [f"{name}:{i + 1}" for i, line in enumerate(text.splitlines())
                  if pattern.search(line)]
  assert not offenders, offenders


def test_the_formulas_typeset_without_a_network(site):
  """MathJax is bundled (docs/javascripts/mathjax): every script the site loads for its maths is
  a file of the site, none a CDN's."""
  page = (site / "papers" / "filfl" / "index.html").read_text(encoding="utf-8")
  scripts = re.findall(r'<script src="([^"]+)"', page)
  maths = [s for s in scripts if "mathjax" in s.lower()]
  assert maths and not [s for s in maths if s.startswith(("http:", "https:", "//"))], maths
  assert all((site / "papers" / "filfl" / s).resolve().is_file() for s in maths), maths
