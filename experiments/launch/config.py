"""A job as one typed value: data, model, local training, engine, parts, seeds, sweeps, outputs.

`JobConfig` describes everything a launcher runs; it is built once from the command line
(`experiments.launch.flag_binding`: each field below is the flag of the same name, its help text and
accepted values written here once), checked once, passed down, and written beside the results as
`config.json`, from which `--config=<out_dir>/config.json` replays the job exactly. Python users
build it directly:

  >>> from experiments.launch import config
  >>> cfg = config.JobConfig()
  >>> cfg.parts.selector.name, cfg.engine.clients_per_round
  ('random', 10)
  >>> config.from_json(config.to_json(cfg)) == cfg
  True
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from experiments.launch import schema
from fedjax_sel import registry
from fedjax_sel.data.corruption import KINDS as CORRUPTION_KINDS
from fedjax_sel.data.partition import PARTITIONS
from fedjax_sel.parts.asynchronous import RULES as ASYNC_RULES
from fedjax_sel.parts.asynchronous import STALENESS

VERSION = 7  # Of the config.json layout; a file of another version is refused, naming both.


@dataclasses.dataclass(frozen=True)
class When:
  """A setting of another field (or of a part's flag: `partition`, `staleness`, `dataset`, ...)
  under which a field has an effect: that field among `values`, or, with `unless`, not among
  them."""

  field: str
  values: tuple
  unless: bool = False

  def holds(self, cfg: JobConfig) -> bool:
    return (flag_value(cfg, self.field) in self.values) != self.unless

  def __str__(self) -> str:
    if self.values in ((True,), (False,)) and not self.unless:
      return f"--{'' if self.values[0] else 'no'}{self.field}"
    shown = " or ".join(str(v) for v in self.values)
    return f"--{self.field} other than {shown}" if self.unless else f"--{self.field}={shown}"


ASYNC = When("mode", ("async",))
LOGNORMAL = When("system_profile", ("lognormal",))
CENTRALIZED = When("store_dir", (None,))  # A store holds its clients' data as they were split.


def option(default: Any, help: str, *, choices: tuple | None = None,  # pylint: disable=redefined-builtin
           within: str | None = None, result: bool = True, applies: tuple[When, ...] = ()) -> Any:
  """A config field that is also a flag of the same name: default, help text, accepted values
  (`choices`, or a number's range `within` as `registry.setting` takes it); `result=False` for a
  field that does not change a run's results (left out of fingerprints); `applies`: the settings
  of other fields under which it has an effect (all of them; none: always), which its help text
  states (`without_effect` refuses it set under others)."""
  field = registry.setting(default, help, choices=choices, within=within)
  return dataclasses.field(default=default, metadata={**field.metadata, "result": result,
                                                      "applies": applies})


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The clients' data: the dataset's split over N clients, held-out shares, corrupted clients."""

  partition: str = option("dirichlet", "How a centralized pool is split: iid; dirichlet (each "
                          "class's shares over clients ~ Dir(alpha)); k_classes (k classes each, "
                          "Flower's pathological); uni_class; dominant; shards (label-sorted "
                          "shards); inner_dirichlet (equal sizes, each client's classes ~ "
                          "Dir(alpha)); lognormal_sizes / power_law_sizes (IID labels, skewed "
                          "sizes: --size_skew).", choices=PARTITIONS, applies=(CENTRALIZED,))
  num_clients: int = option(50, "Total clients in the population (N).", within=">= 1")
  dirichlet_alpha: float = option(0.5, "Concentration of the dirichlet and inner_dirichlet "
                                  "partitions (alpha); smaller is more skewed.", within="> 0",
                                  applies=(When("partition", ("dirichlet", "inner_dirichlet")),
                                           CENTRALIZED))
  classes_per_client: int = option(2, "Classes each client holds under --partition=k_classes (k), "
                                   "1..C.", within=">= 1",
                                   applies=(When("partition", ("k_classes",)), CENTRALIZED))
  dominant_fraction: float = option(0.8, "Dominant-class share of the dominant partition.",
                                    within="[0, 1]",
                                    applies=(When("partition", ("dominant",)), CENTRALIZED))
  shards_per_client: int = option(2, "Shards per client under --partition=shards (the pool "
                                  "sorted by label, cut into N x this many shards).", within=">= 1",
                                  applies=(When("partition", ("shards",)), CENTRALIZED))
  size_skew: float = option(1.0, "Client-size skew: the sigma of --partition=lognormal_sizes, the "
                            "Pareto shape of --partition=power_law_sizes (smaller: heavier tail).",
                            within="> 0", applies=(When("partition", ("lognormal_sizes",
                                                                      "power_law_sizes")),
                                                   CENTRALIZED))
  test_fraction: float = option(0.2, "Share of each client's examples held out as its test split "
                                "(every launcher reports test accuracy; a run without test "
                                "examples has none to report).", within="(0, 0.9]")
  val_fraction: float = option(0.0, "Share of each client's examples held out as its validation "
                               "split.", within="[0, 0.9]")
  public_fraction: float = option(0.0, "Server public set: stratified share of the pool (or of "
                                  "each client for synth/leaf).", within="[0, 0.9]")
  max_examples: int | None = option(None, "Keep at most this many examples of the centralized pool "
                                    "(a seeded sample).", within=">= 1", applies=(CENTRALIZED,))
  store_dir: str | None = option(None, "Read the federated dataset from a memory-mapped store "
                                 "folder (fedjax_sel.data.store.write_store / synth_store) instead "
                                 "of --dataset.")
  corrupt_fraction: float = option(0.0, "Share of the clients whose data are corrupted (bad "
                                   "clients).", within="[0, 1]")
  corrupt_kinds: tuple[str, ...] = option(CORRUPTION_KINDS, "How the bad clients' data are "
                                          "corrupted, split evenly among them: shuffle (random "
                                          "labels), flip (one wrong class per client), noise "
                                          "(Gaussian features); values among "
                                          f"{CORRUPTION_KINDS}.",
                                          applies=(When("corrupt_fraction", (0.0,), unless=True),))


@dataclasses.dataclass(frozen=True)
class LocalConfig:
  """What a selected client does with the global model: its local optimizer and steps."""

  lr: float = option(0.1, "Client learning rate (eta_l).", within=">= 0")
  lr_decay: float = option(1.0, "Multiply lr by this every --lr_decay_every rounds.",
                           within="[0, 1]")
  lr_decay_every: int = option(10, "Rounds between multiplications of the learning rate by "
                               "--lr_decay.", within=">= 1",
                               applies=(When("lr_decay", (1.0,), unless=True),))
  momentum: float = option(0.0, "Client SGD momentum (heavy ball; 0 is plain SGD).",
                           within="[0, 1)")
  weight_decay: float = option(0.0, "Client decoupled weight decay (AdamW-style, per step).",
                               within=">= 0")
  batch_size: int = option(16, "Examples per local training step (B).", within=">= 1")
  local_epochs: int = option(2, "Passes over its data each client makes per round (E).",
                             within=">= 1")
  local_steps: int | None = option(None, "A fixed number of local steps per client and round "
                                   "instead of --local_epochs.", within=">= 1")
  prox_mu: float = option(0.0, "FedProx proximal coefficient (mu; 0 is FedAvg).", within=">= 0")
  chunk_size: int | None = option(None, "Clients vmapped together (default: from the step's cost: "
                                  "1-4 on CPU, what fits a quarter of device memory on "
                                  "accelerators).", within=">= 1", result=False)
  micro_batch: int | None = option(None, "Compute each step this many rows at a time (a divisor "
                                   "of --batch_size), skipping those past a client's last "
                                   "example: pays where B is large beside the clients (B = 64 "
                                   "on the digits: 1.7-2.2x faster), not at B = 16 (slower). "
                                   "Equal to float rounding; not for BatchNorm models.",
                                   within=">= 1")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """How the rounds run: their number, K, the mode, evaluation and the data's placement."""

  rounds: int = option(30, "Communication rounds to run (T; a resumed job runs up to this many "
                       "in total).", within=">= 1", result=False)
  clients_per_round: int = option(10, "Clients trained per round (K; at most n, "
                                  "--num_available).", within=">= 1")
  mode: str = option("sync", "sync: rounds of K clients; async: clients train at once and the "
                     "server steps when --buffer_size updates arrived on the simulated clock "
                     "(FedBuff, FedAsync; --rounds counts server steps; needs --system_profile).",
                     choices=("sync", "async"))
  nonfinite: str = option("stop", "When a model or loss is not finite: stop the run naming the "
                          "round, or exclude the diverged client updates from aggregation and "
                          "count them (nonfinite_clients).", choices=("stop", "exclude"))
  store: str = option("auto", "Clients' data on the device (fast while they fit), in host memory / "
                      "a memory-mapped store with each round's available clients' rows sent to the "
                      "device, or auto (host when the data exceed a share of device memory).",
                      choices=("auto", "device", "host"), result=False)
  eval_every: int = option(1, "Evaluate the global model every this many rounds.",
                           within=">= 1", result=False)
  stages: str = option("auto", "How a round compiles: one program, or three (plan, training, "
                       "finish) whose training is compiled once for every method and job of the "
                       "process that trains alike; auto: three where another method of the job "
                       "trains alike (the records are the same either way; --mode=async "
                       "keeps one).",
                       choices=("auto", "one", "three"), result=False,
                       applies=(When("mode", ("sync",)),))
  concurrent_batches: int = option(0, "Batches of runs advanced at once, each on a thread of its "
                                   "own (the records are the same either way; a CPU runs a "
                                   "batch's rounds on about one core): the job's methods side by "
                                   "side, or a lone method's runs cut into that many equal "
                                   "batches where they divide (two runs or more each). 0 = auto: "
                                   "2 in a single-device CPU process with 2 or more cores, else "
                                   "1; --wandb (a W&B run is process-wide) and a host store keep "
                                   "one batch at a time.", within=">= 0", result=False,
                                   applies=(When("wandb", (False,)),
                                            When("store", ("host",), unless=True)))


@dataclasses.dataclass(frozen=True)
class ClockConfig:
  """The simulated clock: the clients' speeds and bandwidths and the round deadline."""

  system_profile: str = option("none", "Clients' speeds and bandwidths for the simulated clock: "
                               "none (rounds take no time), lognormal (drawn around --speed_median "
                               "and --bandwidth_median, the same population for every seed), a "
                               "CSV file with the header client,speed,bandwidth, or "
                               "fedscale:FILE (FedScale's client_device_capacity pickle, clients "
                               "drawn onto its devices). Rounds then report round_time_s and "
                               "sim_time_s.")
  deadline_s: float = option(0.0, "Round deadline in simulated seconds: clients that finish later "
                             "are stragglers, left out of the aggregate (0: no deadline; needs "
                             "--system_profile; not in --mode=async).", within=">= 0",
                             applies=(When("system_profile", ("none",), unless=True),
                                      When("mode", ("sync",))))


@dataclasses.dataclass(frozen=True)
class LognormalConfig:
  """The log-normal clock profile (--system_profile=lognormal): each client's compute speed and
  bandwidth drawn around their medians, the same population for every seed."""

  speed_median: float = option(100.0, "Median compute speed, training samples per second.",
                               within="> 0", applies=(LOGNORMAL,))
  speed_sigma: float = option(0.8, "Sigma of log speed (0: every client at the median).",
                              within=">= 0", applies=(LOGNORMAL,))
  bandwidth_median: float = option(1e6, "Median bandwidth, bytes per second.", within="> 0",
                                   applies=(LOGNORMAL,))
  bandwidth_sigma: float = option(0.8, "Sigma of log bandwidth (0: every client at the median).",
                                  within=">= 0", applies=(LOGNORMAL,))


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """The asynchronous mode (--mode=async): FedBuff and FedAsync on the simulated clock."""

  concurrency: int = option(0, "async: clients training at once, C (0: twice the buffer size).",
                            within=">= 0", applies=(ASYNC,))
  buffer_size: int = option(0, "async: updates per server step, K (0: --clients_per_round; a "
                            "freed slot is refilled at once, the selector asked for one client).",
                            within=">= 0", applies=(ASYNC,))
  async_rule: str = option("fedbuff", "async: fedbuff (staleness-weighted deltas, aggregated) or "
                           "fedasync (the aggregate mixed in with --async_alpha * s(staleness)).",
                           choices=ASYNC_RULES, applies=(ASYNC,))
  staleness: str = option("polynomial", "async: staleness weight s(tau): constant (1), polynomial "
                          "((1 + tau)^-a; FedBuff's 1/sqrt(1 + tau) at a = 0.5) or hinge (1 up to "
                          "b, then 1 / (a (tau - b) + 1)).",
                          choices=STALENESS, applies=(ASYNC,))
  staleness_a: float = option(0.5, "async: the polynomial and hinge staleness functions' a.",
                              within=">= 0",
                              applies=(ASYNC, When("staleness", ("polynomial", "hinge"))))
  staleness_b: float = option(4.0, "async: the hinge staleness function's b.", within=">= 0",
                              applies=(ASYNC, When("staleness", ("hinge",))))
  async_alpha: float = option(0.6, "async, fedasync: the mixing weight alpha.", within="(0, 1]",
                              applies=(ASYNC, When("async_rule", ("fedasync",))))
  avail_window_s: float = option(1.0, "async: simulated seconds per availability index (a client "
                                 "is available at time T when the availability model has it at "
                                 "round floor(T / window)).", within="> 0", applies=(ASYNC,))
  max_staleness: int = option(-1, "async: discard updates staler than this many server steps when "
                              "they arrive, counted as stale_dropped (FedScale's and FLSim's "
                              "bound; -1: keep every update).", within=">= -1",
                              applies=(ASYNC,))


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """The job's folder, its checkpoints, progress lines, summaries, figures and trackers."""

  out_dir: str = option("runs/run", "Folder of the job: per-run metrics and checkpoints, summary, "
                        "figures, flags.txt and job.json.")
  resume: bool = option(False, "Continue each run from its checkpoint in --out_dir (refused, "
                        "naming the settings, if they changed; runs without one start fresh).")
  overwrite: bool = option(False, "Replace the previous runs in --out_dir (without it or --resume, "
                           "an --out_dir holding a run is refused).")
  checkpoint_every: int = option(10, "Rounds between checkpoints of each run (a resumed run "
                                 "continues from its last).", within=">= 1")
  log_every: int = option(1, "Print a progress line every this many rounds (and on the first and "
                          "last; the records keep every round).", within=">= 1")
  last_k: int = option(10, "Rounds of the summaries' last-k mean (the final round alone is "
                       "noisy).", within=">= 1")
  target: float = option(0.85, "The test accuracy whose first crossing the summary reports per "
                         "method: rounds trained and, on the simulated clock, simulated seconds "
                         "to reach it.", within="(0, 1]", result=False)
  plot: bool = option(False, "Draw the figures after the runs (needs matplotlib).")
  figure_format: str = option("png", "File format of the --plot figures: png, or pdf / svg "
                              "(vector, for papers).", choices=("png", "pdf", "svg"),
                              applies=(When("plot", (True,)),))
  tensorboard: bool = option(False, "Also write each run's per-round scalars as TensorBoard events "
                             "under its folder (tensorboard --logdir=<out_dir>); needs the "
                             "tensorboard extra, pip install -e '.[tensorboard]'.")
  wandb: bool = option(False, "Also log each run's per-round scalars to Weights & Biases, one "
                       "W&B run per run (its config the run's settings, its files under the "
                       "run's folder); needs the wandb extra, pip install -e '.[wandb]'.",
                       result=False)
  wandb_project: str = option("fedjax_sel", "The W&B project --wandb logs the runs to.",
                              result=False, applies=(When("wandb", (True,)),))
  wandb_mode: str = option("offline", "--wandb: offline (nothing leaves the machine; `wandb sync` "
                           "uploads later) or online (streams; needs `wandb login`).",
                           choices=("offline", "online"), result=False,
                           applies=(When("wandb", (True,)),))
  fast_compile: bool = option(False, "Compile the rounds with XLA:CPU's legacy loop emitters: "
                              "about a quarter less compiling, rounds as fast, but the records "
                              "may differ in the last float bits from a run without it "
                              "(fedjax_sel.use_fast_compile).")
  batch_runs: bool = option(True, "Advance a method's runs (its seeds, and --sweep values) "
                            "together as one batched compiled program (device store); "
                            "--nobatch_runs runs them one after another, still sharing one "
                            "compiled round.")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """A run over several hosts (jax.distributed)."""

  coordinator_address: str | None = option(None, "host:port of process 0 of a multi-host run "
                                           "(jax.distributed); set --num_processes and "
                                           "--process_id too.")
  num_processes: int = option(1, "Processes of a multi-host run (1: one host).", within=">= 1")
  process_id: int = option(0, "This process's index, 0..--num_processes-1.", within=">= 0")
  distributed_auto: bool = option(False, "Join a multi-host run by jax.distributed's cluster "
                                  "detection (SLURM, Cloud TPU, ...) instead of the three flags "
                                  "above.")
  distributed_timeout: int = option(60, "Seconds to wait for every process to join a multi-host "
                                    "run before failing.", within=">= 1")


@dataclasses.dataclass(frozen=True)
class Part:
  """A part of the round by its registered name (`fedjax_sel.registry`) and typed settings."""

  name: str
  settings: Any


def part(kind: str, name: str, **settings) -> Part:
  """Part `name` of `kind` with its registered settings type (defaults, then `settings`)."""
  return Part(name, registry.lookup(kind, name).settings(**settings))


setting_flag = registry.setting_flag


OPTIONAL_KINDS = ("filter", "rule", "server_optimizer")  # None: the round has no such part.
# The availability model turned on, where the command line chose none, for a part that requires
# clients available at different times (`registry.REQUIREMENTS`): each client around its own noon.
VARIED_AVAILABILITY = "diurnal"
# The flag choosing each kind of part (and the job's dataset and model).
PART_FLAG = {"selector": "selector", "filter": "filter", "rule": "rule",
             "aggregator": "aggregator", "server_optimizer": "server_opt",
             "availability": "availability", "dataset": "dataset", "model": "model"}


@dataclasses.dataclass(frozen=True)
class PartsConfig:
  """The parts of the round: a selector, an aggregator and the clients' availability model, and
  optionally a filter, a participation rule and a server optimizer."""

  selector: Part = dataclasses.field(default_factory=lambda: part("selector", "random"))
  filter: Part | None = None
  rule: Part | None = None
  aggregator: Part = dataclasses.field(default_factory=lambda: part("aggregator", "fedavg"))
  server_optimizer: Part | None = None
  availability: Part = dataclasses.field(default_factory=lambda: part("availability", "uniform"))
  dataset: Part = dataclasses.field(default_factory=lambda: part("dataset", "digits"))
  model: Part = dataclasses.field(default_factory=lambda: part("model", "mlp"))


@dataclasses.dataclass(frozen=True)
class Method:
  """One method of a job: its runs' folder `key`, display `label` and the parts it puts in place
  of the job's (`parts`: kind -> `Part`, or None for no such part)."""

  key: str
  label: str
  parts: tuple[tuple[str, Part | None], ...] = ()

  def apply(self, cfg: JobConfig) -> JobConfig:
    """`cfg` with this method's parts."""
    return dataclasses.replace(cfg, parts=dataclasses.replace(cfg.parts, **dict(self.parts)))


@dataclasses.dataclass(frozen=True)
class Sweep:
  """Settings swept together: one `--sweep` (a run per point, for each seed). One name is a plain
  sweep (`--sweep=lr:0.05,0.1`); several, joined by `+`, are zipped: their i-th values form the
  i-th point (`--sweep=lr:0.05,0.1+prox_mu:0,0.01`). Several `Sweep`s form their product.

  Attributes:
    names: the flags swept (the folder and label tags).
    targets: where each sets its value: a config field's dotted path (`local.lr`), or a part's
      setting as `kind/part.field` (`selector/oort.exploration_factor`), which applies to the
      runs whose method has that part.
    points: the swept values, a tuple of one value per name for each point.
  """

  names: tuple[str, ...]
  targets: tuple[str, ...]
  points: tuple[tuple[bool | int | float | str, ...], ...]

  def tag(self, point: tuple) -> str:
    """"NAME=V" (joined by "," for a zipped sweep): the folder and label tag of a point's runs
    (V as `number_text` writes it: two values never share a folder)."""
    return ",".join(f"{n}={number_text(v) if isinstance(v, float) else v}"
                    for n, v in zip(self.names, point))

  def applied(self, cfg: JobConfig, point: tuple) -> JobConfig | None:
    """`cfg` with the point's values, or None when none of its targets is in `cfg` (a method
    without the swept part: the sweep leaves its runs alone)."""
    paths = [target_path(cfg, target) for target in self.targets]
    if all(path is None for path in paths):
      return None
    for path, value in zip(paths, point):
      cfg = cfg if path is None else replace(cfg, path, value)
    return cfg


RUN_VALUE_FIELDS = ("lr", "prox_mu")  # Section fields that are run values (one program).
# The kinds of part a batch rebuilds from their recipes (`fedjax_sel.engine.sweeps`); the others'
# settings (availability, model) compile a program per value.
SWEPT_KINDS = ("selector", "filter", "rule", "aggregator", "server_optimizer")


def split_target(one: str) -> tuple[str | None, str, str]:
  """(kind, part, field) of one part-setting target (`kind/part.field`); (None, section, field)
  of a config field path (`section.field`)."""
  if "/" not in one:
    section, field = one.rsplit(".", 1)
    return None, section, field
  kind, rest = one.split("/", 1)
  part, field = rest.rsplit(".", 1)
  return kind, part, field


def target_field(one: str) -> dataclasses.Field | None:
  """The dataclass field one target sets: a part's settings field, or a section's (None for a
  field of neither, a launcher's own)."""
  kind, owner, name = split_target(one)
  if kind is not None:
    fields = dataclasses.fields(registry.lookup(kind, owner).settings)
  else:
    fields = dataclasses.fields(SECTIONS[owner]) if owner in SECTIONS else ()
  return next((f for f in fields if f.name == name), None)


def target_kind(target: str) -> str:
  """How runs that differ at a sweep target share a program: "value" when every part it may set
  calls it a value (`registry.sweeps`) or it is a run value (`RUN_VALUE_FIELDS`); else
  "structural" (a program per value)."""
  kinds = set()
  for one in target.split("|"):
    kind, _, field = split_target(one)
    if kind is None:
      kinds.add("value" if field in RUN_VALUE_FIELDS else "structural")
    else:
      kinds.add(registry.sweeps(target_field(one)) if kind in SWEPT_KINDS else "structural")
  return "value" if kinds == {"value"} else "structural"


def target_path(cfg: JobConfig, target: str) -> str | None:
  """The config path a sweep target sets in `cfg`: a field path as it is, a part's setting
  (`kind/part.field`, alternatives joined by "|") where `cfg`'s part of that kind is that part
  (else None)."""
  for one in target.split("|"):  # A flag several parts share: the one `cfg` has.
    kind, name, field = split_target(one)
    if kind is None:
      return one
    part = getattr(cfg.parts, kind, None)
    if part is not None and part.name.rsplit(":", 1)[-1] == name.rsplit(":", 1)[-1]:
      return f"parts.{kind}.settings.{field}"
  return None


def number_text(value: float) -> str:
  """A number as short text that reads back as the same number: `:g`'s where that is exact
  (0.1, 1e-05, 2), else Python's shortest exact form (0.12345678, not `:g`'s 0.123457).

    >>> number_text(2.0), number_text(0.12345678)
    ('2', '0.12345678')
  """
  text = f"{value:g}"
  return text if float(text) == value else repr(float(value))


@dataclasses.dataclass(frozen=True)
class JobConfig:
  """A whole job: what every run shares, the launcher's own `options` (a frozen dataclass of
  `option` fields, or None), its `methods` (none: one method of the job's parts), seeds and sweep.
  """

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  local: LocalConfig = dataclasses.field(default_factory=LocalConfig)
  engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
  clock: ClockConfig = dataclasses.field(default_factory=ClockConfig)
  lognormal: LognormalConfig = dataclasses.field(default_factory=LognormalConfig)
  asynchrony: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)
  parts: PartsConfig = dataclasses.field(default_factory=PartsConfig)
  seeds: tuple[int, ...] = (0,)
  sweeps: tuple[Sweep, ...] = ()
  output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
  launcher: str = "experiments.run"
  options: Any = None
  methods: tuple[Method, ...] = ()

  def runs(self) -> list[tuple[Method, tuple[tuple[Sweep, tuple], ...], JobConfig]]:
    """(method, its swept points, the run's config) per method and point of the sweeps'
    product, in that order (a run per seed of each). A sweep none of whose settings a method
    has leaves it out of that method's points (its runs are not repeated)."""
    methods = self.methods or (Method("", ""),)
    out = []
    for method in methods:
      combos = [((), method.apply(self))]
      for sweep in self.sweeps:
        grown = []
        for points, cfg in combos:
          for point in sweep.points:
            swept = sweep.applied(cfg, point)
            if swept is None:  # Not this method's setting: one run, untagged.
              grown.append((points, cfg))
              break
            grown.append((points + ((sweep, point),), swept))
        combos = grown
      out.extend((method, points, cfg) for points, cfg in combos)
    return out


def points_tag(points: tuple[tuple[Sweep, tuple], ...]) -> str:
  """A run's folder path below its method for its swept points ("lr=0.1/poc_d=4"; "" for none)."""
  return "/".join(sweep.tag(point) for sweep, point in points)


def points_values(points: tuple[tuple[Sweep, tuple], ...]) -> dict[str, Any]:
  """{flag: value} of a run's swept points (job.json records them for experiments.compare)."""
  return {n: v for sweep, point in points for n, v in zip(sweep.names, point)}


SECTIONS = {"data": DataConfig, "local": LocalConfig, "engine": EngineConfig,
            "clock": ClockConfig, "lognormal": LognormalConfig, "asynchrony": AsyncConfig,
            "output": OutputConfig,
            "distributed": DistributedConfig}
# Sections that do not change a run's results: left out of its fingerprint (and fields marked so).
NOT_RESULTS = ("output", "distributed")


def get(cfg: Any, path: str) -> Any:
  """The value of a dotted field path, e.g. `get(cfg, "local.lr")`."""
  value = cfg
  for name in path.split("."):
    value = getattr(value, name)
  return value


def replace(cfg: Any, path: str, value: Any) -> Any:
  """`cfg` with the dotted field `path` set to `value` (unchanged where a part on the path is
  None: a method without that part)."""
  head, _, rest = path.partition(".")
  if not rest:
    return dataclasses.replace(cfg, **{head: value})
  inner = getattr(cfg, head)
  if inner is None:
    return cfg
  return dataclasses.replace(cfg, **{head: replace(inner, rest, value)})


def preset_help(presets: dict[str, dict]) -> str:
  """One line per preset listing the fields it sets, as flags (for a --preset flag's help)."""
  return "; ".join(f"{name}: " + ", ".join(f"--{k}={','.join(v) if isinstance(v, list) else v}"
                                          for k, v in values.items())
                   for name, values in presets.items())


def field_names(section: str) -> tuple[str, ...]:
  """The names of a section's fields (its flags)."""
  return tuple(f.name for f in dataclasses.fields(SECTIONS[section]))


def field_section(name: str, options: type | None = None) -> str | None:
  """The section ("data", ..., or "options") whose field `name` is, or None."""
  for section, cls in SECTIONS.items():
    if name in {f.name for f in dataclasses.fields(cls)}:
      return section
  if options is not None and name in {f.name for f in dataclasses.fields(options)}:
    return "options"
  return None


def flag_value(cfg: JobConfig, name: str) -> Any:
  """The value of flag `name` in `cfg`: a section's or the options' field, or the name of the
  part a part's flag chooses ("none" for none)."""
  section = field_section(name, type(cfg.options) if cfg.options is not None else None)
  if section is not None:
    return get(cfg, f"{section}.{name}")
  kind = next(k for k, flag in PART_FLAG.items() if flag == name)
  chosen = getattr(cfg.parts, kind)
  return "none" if chosen is None else chosen.name


def _flag_text(name: str, value: Any) -> str:
  """`--name=value` as a command line gives it (`--name` / `--noname` for a bool)."""
  if isinstance(value, bool):
    return f"--{'' if value else 'no'}{name}"
  shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
  return f"--{name}={shown}"


def without_effect(cfg: JobConfig, base: JobConfig, names) -> list[str]:
  """The fields among `names` (flags) that `cfg` sets off their value in `base` (the launcher's
  defaults) where they have no effect (an `applies` setting of their `option` unmet), each
  as "--staleness_b=2.0 has no effect with --staleness=constant (it applies with
  --staleness=hinge)".

    >>> without_effect(updated(JobConfig(), shards_per_client=3), JobConfig(),
    ...                {"shards_per_client"})  # doctest: +ELLIPSIS
    ['--shards_per_client=3 has no effect with --partition=dirichlet (it applies with ...)']
  """
  groups = [getattr(cfg, s) for s in SECTIONS] + [cfg.options] * (cfg.options is not None)
  out = []
  for group in groups:
    for f in dataclasses.fields(group):
      value = getattr(group, f.name)
      unmet = [w for w in f.metadata.get("applies", ()) if not w.holds(cfg)]
      if f.name in names and unmet and value != flag_value(base, f.name):
        now = ", ".join(_flag_text(w.field, flag_value(cfg, w.field)) for w in unmet)
        out.append(f"{_flag_text(f.name, value)} has no effect with {now} (it applies with "
                   f"{', '.join(map(str, unmet))})")
  return out


def updated(cfg: JobConfig, skip: set[str] | frozenset = frozenset(), **values) -> JobConfig:
  """`cfg` with fields set by their flag names (a section's or the options' field, or a setting
  of one of the job's parts), lists as tuples; the names in `skip` are left as they are.

    >>> updated(JobConfig(), rounds=5, lr=0.5).engine.rounds
    5
  """
  for name, value in values.items():
    if name in skip:
      continue
    value = tuple(value) if isinstance(value, list) else value
    section = field_section(name, type(cfg.options) if cfg.options is not None else None)
    if section is not None:
      cfg = replace(cfg, f"{section}.{name}", value)
      continue
    kind = next((k for k, flag in PART_FLAG.items() if flag == name), None)
    if kind is not None:  # A part chosen by its flag (its settings kept where it is the same).
      held = getattr(cfg.parts, kind)
      chosen = None if value == "none" else (held if held is not None and held.name == value
                                             else part(kind, value))
      cfg = dataclasses.replace(cfg, parts=dataclasses.replace(cfg.parts, **{kind: chosen}))
      continue
    for kind in registry.KINDS:
      p = getattr(cfg.parts, kind)
      fields = [] if p is None else dataclasses.fields(p.settings)
      owned = next((f for f in fields if setting_flag(p.name, f) == name), None)
      if owned is not None:
        cfg = replace(cfg, f"parts.{kind}.settings.{owned.name}", value)
        break
    else:
      raise ValueError(f"{name!r} is not a field of the job config nor a setting of its parts")
  return cfg


def _plain(value: Any) -> Any:
  return list(value) if isinstance(value, tuple) else value


def fingerprint(cfg: JobConfig) -> dict:
  """What in a run's config determines its results, flat by flag name: the sections' fields (not
  the output or distributed ones, nor those marked `result=False`), each part's name (under the
  flag choosing it) and settings, the options' fields."""
  out = {}
  for section, cls in SECTIONS.items():
    if section not in NOT_RESULTS:
      out.update({f.name: _plain(getattr(getattr(cfg, section), f.name))
                  for f in dataclasses.fields(cls) if f.metadata.get("result", True)})
  for kind in registry.KINDS:
    p = getattr(cfg.parts, kind)
    out[f"part_{kind}"] = None if p is None else p.name
    if p is not None:
      out.update({setting_flag(p.name, f): _plain(getattr(p.settings, f.name))
                  for f in dataclasses.fields(p.settings)})
  if cfg.options is not None:
    out.update({f.name: _plain(getattr(cfg.options, f.name))
                for f in dataclasses.fields(cfg.options) if f.metadata.get("result", True)})
  return out


def fingerprint_defaults(cfg: JobConfig) -> dict:
  """`fingerprint` of `cfg` with every section field and every chosen part's settings at their
  defaults: what a setting added after a run started stood for (`checkpoint.load`)."""
  fresh = {section: cls() for section, cls in SECTIONS.items()}
  parts = {kind: None if p is None else dataclasses.replace(p, settings=type(p.settings)())
           for kind in registry.KINDS for p in [getattr(cfg.parts, kind)]}
  options = None if cfg.options is None else type(cfg.options)()
  return fingerprint(dataclasses.replace(cfg, **fresh, parts=dataclasses.replace(cfg.parts,
                                                                                 **parts),
                                         options=options))


def to_dict(cfg: JobConfig) -> dict:
  """A JSON-ready dict (parts as {"name", "settings"})."""
  def encode(value):
    if isinstance(value, Part):
      settings = (dataclasses.asdict(value.settings)
                  if dataclasses.is_dataclass(value.settings) else None)
      return {"name": value.name, "settings": settings}
    if isinstance(value, Method):
      return {"key": value.key, "label": value.label,
              "parts": {kind: encode(p) for kind, p in value.parts}}
    if dataclasses.is_dataclass(value):
      return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
      return [encode(v) for v in value]
    return value
  return {"version": VERSION, **encode(cfg)}


def to_json(cfg: JobConfig) -> str:
  return json.dumps(to_dict(cfg), indent=1, sort_keys=True) + "\n"


@dataclasses.dataclass(frozen=True)
class _PartEntry:
  """A part as config.json holds it (`to_dict`)."""

  name: str
  settings: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class _MethodEntry:
  """A method as config.json holds it (`to_dict`)."""

  key: str
  label: str
  parts: dict[str, Any]


def _decode_parts(data: dict[str, Any], where: str, path: str) -> dict[str, Part | None]:
  """{kind: part} of a `parts` object (`to_dict`'s), each checked against its kind's registry."""
  unknown = sorted(set(data) - set(registry.KINDS))
  if unknown:
    raise ValueError(f"{where}: {path} has unknown kinds {unknown}; accepted: "
                     f"{list(registry.KINDS)}")
  return {kind: _decode_part(kind, p, where, f"{path}.{kind}") for kind, p in data.items()}


def _decode_part(kind: str, data: Any, where: str, path: str) -> Part | None:
  if data is None:
    return None
  entry = schema.conform(data, _PartEntry, where, path)
  try:
    registered = registry.lookup(kind, entry.name)
  except ValueError as e:
    raise ValueError(f"{where}: {path}.name: {e}") from e
  settings = (registered.settings() if entry.settings is None else
              schema.conform(entry.settings, registered.settings, where, f"{path}.settings"))
  return Part(entry.name, settings)


def from_dict(data: Any, where: str = "config", options: type | None = None) -> JobConfig:
  """The `JobConfig` of `to_dict`'s output (`options`: the launcher's options type); ValueError
  naming `where` (the file) and the field at fault by its path, e.g. `data.num_clients`."""
  if not isinstance(data, dict):
    raise ValueError(f"{where}: the file must be a JSON object, got {schema.describe(data)}")
  data = dict(data)
  version = data.pop("version", None)
  if version != VERSION:
    raise ValueError(f"{where}: config version {version!r}, this fedjax_sel reads version "
                     f"{VERSION}; rerun the job from its command line")
  parts = schema.conform(data.pop("parts", {}), dict[str, Any], where, "parts")
  methods = schema.conform(data.pop("methods", []), tuple[_MethodEntry, ...], where, "methods")
  opts = data.pop("options", None)
  cfg = schema.conform(data, JobConfig, where)
  if (opts is None) != (options is None):
    raise ValueError(f"{where}: options for {cfg.launcher} do not match this launcher's")
  return dataclasses.replace(
      cfg, parts=dataclasses.replace(cfg.parts, **_decode_parts(parts, where, "parts")),
      options=None if opts is None else schema.conform(opts, options, where, "options"),
      methods=tuple(Method(m.key, m.label, tuple(_decode_parts(m.parts, where,
                                                               f"methods[{i}].parts").items()))
                    for i, m in enumerate(methods)))


def from_json(text: str, where: str = "config", options: type | None = None) -> JobConfig:
  """`from_dict` of a config.json's text."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not JSON ({e})") from e
  return from_dict(data, where, options)
