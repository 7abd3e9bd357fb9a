"""`fedjax-sel LAUNCHER [flags]`: every launcher as one installed command, from any folder.

  fedjax-sel run --selector=oort --sweep=oort_exploration:0.1,0.9 --out_dir=runs/oort
  fedjax-sel compare runs/oort --by=oort_exploration

Each launcher runs as `python -m experiments.LAUNCHER [flags]` does (its `--help` lists its
flags); `fedjax-sel --help` lists the launchers.
"""

from __future__ import annotations

import runpy
import sys

LAUNCHERS = {
    "run": "any composition of parts, the library's generic launcher",
    "filfl": "FilFL: greedy client filtering on a public set",
    "fedalign": "FedALIGN: non-priority clients join when aligned with the priority ones",
    "uacs": "UACS-FL: entropy-ranked client selection",
    "fedsrc": "FedSRC: self-regulating clients and robust aggregators",
    "bench": "the selection benchmark: every selector x scenarios, one leaderboard",
    "compare": "jobs side by side: one table and overlay figures",
    "make_store": "a dataset written as a host store for populations beyond memory",
}


def usage() -> str:
  width = max(map(len, LAUNCHERS))
  return ("usage: fedjax-sel LAUNCHER [flags]   (fedjax-sel LAUNCHER --help: its flags)\n\n"
          "launchers:\n" + "\n".join(f"  {name:<{width}}  {about}"
                                     for name, about in LAUNCHERS.items()))


def main(argv: list[str] | None = None) -> int:
  """Runs the launcher `argv[0]` names with the rest of `argv` as its command line."""
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0
  name, rest = argv[0], argv[1:]
  if name not in LAUNCHERS:
    print(f"fedjax-sel: no launcher {name!r}\n\n{usage()}", file=sys.stderr)
    return 2
  sys.argv = [f"fedjax-sel {name}", *rest]
  runpy.run_module(f"experiments.{name}", run_name="__main__", alter_sys=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
