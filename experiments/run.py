r"""Generic launcher: any selector, filter, participation rule, aggregator and server optimizer on
any dataset, model and partition.

  python -m experiments.run --dataset=digits --partition=dirichlet --rounds=30 --out_dir=runs/fedavg
  python -m experiments.run --seeds=0,1,2 --sweep=lr:0.05,0.1,0.2   # 9 runs, one batched program
  python -m experiments.run --selector=oort --system_profile=lognormal --deadline_s=20
  python -m experiments.run --selector=entropy --rule=fedsrc --aggregator=krum --server_opt=adam
  python -m experiments.run --filter=dgf --selector=poc --rule=fedalign
  python -m experiments.run --dataset=fashion_mnist --num_clients=1000 --num_available=1000 \
      --model=logreg --aggregator=dp_fedavg --selector=poisson --sample_rate=0.05 \
      --clients_per_round=94 --dp_clip=0.2 --dp_target_epsilon=2   # User-level DP, accounted.
  python -m experiments.run --config=runs/fedavg/config.json --out_dir=runs/again  # Replay.

Parts (registered in `fedjax_sel.registry`; each setting is a flag): `--selector` random, poc,
divfl, entropy, grad_norm, oort, pyramidfl, md, afl, clustered_size, clustered_similarity, exp3,
fedcs, tifl, refl, ocs, delta, fedcor (docs/papers/selection.md; those on the clock turn it on),
poisson (`--sample_rate`, for differential privacy), or `module:name` of one registered outside the
package;
`--filter` none, dgf, rgf (FilFL; a 5% public set unless `--public_fraction` says otherwise);
`--rule` none, fedalign (priority clients from `--num_priority` / `--priority_ids` /
`--priority_classes`; the clean metrics are theirs), fedsrc (its `--decision_stat=val_loss` gets a
10% validation split unless `--val_fraction` is given); `--aggregator` fedavg, median,
trimmed_mean, krum, multi_krum, fedasl, and the private dp_fedavg, dp_adaptive, dp_ftrl
(`--dp_noise`, `--dp_clip`, `--dp_target_epsilon`, ...; docs/papers/privacy.md); `--server_opt`
none, sgd, momentum, adam, yogi, adagrad.
The defaults are FedAvg (FedProx with `--prox_mu`) with random selection. `--corrupt_fraction`
corrupts that share of the clients (`--corrupt_kinds`: shuffle, flip, noise), as FilFL's and
FedSRC's launchers do; the clean_* metrics then leave them out.

Writes `<out_dir>/seed<s>/metrics.jsonl` (`<out_dir>/<name>=<value>/seed<s>/` with --sweep; one
JSON line per round, flushed as it comes), prints per-round progress and a final summary table
(also saved as `<out_dir>/summary.md`), and the job's `config.json` and `flags.txt`.
"""

import dataclasses


import fedjax_sel as fs
from experiments.launch import build, cli, config, flag_binding, privacy, report
from experiments.launch.job import Job
from fedjax_sel import registry

DEFAULTS = config.JobConfig()
BINDING = flag_binding.define(DEFAULTS, choose=registry.KINDS)


ASYNC = {"fedbuff": "FedBuff", "fedasync": "FedAsync"}


def label(cfg: config.JobConfig) -> str:
  """The method's name from what it runs: its aggregation (FedAvg, Krum, ...; FedAdam etc. with a
  server optimizer; FedProx local training), then its selector, filter and rule when not the
  plain ones, e.g. "Krum + entropy + fedsrc"; in the asynchronous mode its rule, C, K and
  staleness function first, e.g. "FedBuff C=20 K=10 polynomial + oort". A part is named by its
  registered label (`registry.label`)."""
  p, plain = cfg.parts, DEFAULTS.parts
  agg = registry.label("aggregator", p.aggregator.name)
  server = (None if p.server_optimizer is None
            else registry.label("server_optimizer", p.server_optimizer.name))
  if server is not None and p.aggregator.name == plain.aggregator.name:
    head = server
  else:
    head = agg if server is None else f"{agg} ({server})"
  fedavg = registry.label("aggregator", plain.aggregator.name)
  if cfg.local.prox_mu:
    head = "FedProx" if head == fedavg else f"{head} + FedProx"
  if cfg.engine.mode == "async":
    e = cfg.asynchrony
    rule = ASYNC[e.async_rule] + ("" if head == fedavg else f" ({head})")
    head = f"{rule} C={e.concurrency} K={e.buffer_size} {e.staleness}"
  rest = [q.name for q in (p.selector, p.filter, p.rule)
          if q is not None and q.name != plain.selector.name]
  if p.availability.name != plain.availability.name:
    rest.append(f"{p.availability.name} availability")
  return " + ".join([head, *rest])


def resolve(cfg: config.JobConfig, given: frozenset) -> config.JobConfig:
  """N from a store, the data the parts need (a public set, a validation split), one method."""
  cfg = privacy.resolve(build.part_defaults(build.store_clients(cfg, given), given))
  return dataclasses.replace(cfg, methods=(config.Method("", label(cfg)),))


def execute(job: Job) -> None:
  """Runs the job `cfg` (every check before any data, every data error before any training)."""
  cfg = job.cfg
  build.check_population(cfg)
  build.check_runs(cfg)
  build.check_corruption(cfg)
  job.start()

  def load(seed, group):
    del group
    return build.corrupt(cfg, build.load_data(cfg, seed), seed)[:2]

  def build_run(spec):
    data, bad = spec.data
    eval_mask = ~bad if bad.any() else None  # clean_* metrics: the uncorrupted clients.
    if "priority" in build.needs(spec.run):  # FedALIGN's rule: its priority clients.
      priority = build.priority_mask(spec.run, data.num_clients, data.label_hist, spec.seed)
      eval_mask = priority & ~bad  # The priority clients' clean data.
    print(f"== {spec.method.label} seed {spec.seed}: {data.name}, N={data.num_clients}, "
          f"bad clients={int(bad.sum())}, model={spec.run.parts.model.name}")
    run = privacy.run_config(spec.run)
    sim = build.simulator(run, data, spec.seed, capacity=spec.capacity, eval_mask=eval_mask)
    return privacy.built(run, sim), privacy.extra(run)

  groups = job.run_groups([""], load, build_run)[0][""]
  if not job.writes:  # Process 0 of a multi-host run writes the files.
    return
  text = (fs.summary_table([(f"{group} seed {s}", r) for group, runs in groups.items()
                            for s, r in zip(cfg.seeds, runs)])
          + "\n\n" + report.method_table(cfg, groups))
  guarantee = privacy.summary(cfg, groups)
  report.write_summary(cfg, text + ("\n\n" + guarantee if guarantee else ""))
  if cfg.output.plot:
    from fedjax_sel.host.plotting import plot_curves  # pylint: disable=import-outside-toplevel
    path = report.figure_path(cfg, "curves")
    plot_curves(groups, ["test_accuracy", "train_loss", "test_loss"], path,
                title=report.setup_title(cfg, ", ".join(filter(None, (
                    cfg.methods[0].label, privacy.title_note(cfg))))))
    print(f"figure: {path}")


main = cli.launcher_main(BINDING, resolve, execute)


if __name__ == "__main__":
  cli.launch(main, BINDING)
