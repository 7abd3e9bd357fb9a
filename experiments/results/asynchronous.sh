#!/bin/sh
# Synchronous and asynchronous training on the simulated clock (docs/papers/asynchronous.md,
# 'Results'): digits split over 50 clients by Dirichlet(0.5) labels, 40 available (redrawn every 5
# rounds; in the asynchronous mode every 5 simulated seconds), an MLP, seeds 0, 1, 2; two speed
# populations: log-normal speeds and bandwidths, and two tiers (80% fast, 20% ten times slower).
# Per population and selector (random, Oort): synchronous FedAvg with K = 10 (60 rounds) and with
# a deadline (1.5 s log-normal, 1 s two tiers: the slow tier misses it), FedBuff with C = 20, K = 10 and 1/sqrt(1 + staleness) (120 server steps), FedAsync
# with C = 10, K = 1, alpha = 0.6 and polynomial staleness (600 server steps).
# Writes runs/async/<population>/<job>/ and experiments/results/asynchronous_<population>.md
# (+ figures of test accuracy over simulated seconds).
set -e
mkdir -p runs/async
python - <<'PY'
import numpy as np
fast = np.arange(50) % 5 != 0  # Every fifth client is slow.
with open("runs/async/two_tier.csv", "w") as f:
    f.write("client,speed,bandwidth\n")
    for c in range(50):
        f.write(f"{c},{200.0 if fast[c] else 20.0},{2e6 if fast[c] else 2e5}\n")
PY
COMMON="--dataset=digits --partition=dirichlet --dirichlet_alpha=0.5 --num_clients=50
  --num_available=40 --model=mlp --hidden=64 --seeds=0,1,2 --overwrite"
for population in lognormal two_tier; do
  profile=$population DEADLINE=1.5
  [ $population = two_tier ] && profile=runs/async/two_tier.csv DEADLINE=1.0
  out=runs/async/$population
  for s in random oort; do
    python -m experiments.run $COMMON --system_profile=$profile --selector=$s \
      --clients_per_round=10 --rounds=60 --eval_every=2 --out_dir=$out/sync_$s
    python -m experiments.run $COMMON --system_profile=$profile --selector=$s \
      --clients_per_round=10 --rounds=60 --eval_every=2 --deadline_s=$DEADLINE \
      --out_dir=$out/sync_deadline_$s
    python -m experiments.run $COMMON --system_profile=$profile --selector=$s --mode=async \
      --buffer_size=10 --concurrency=20 --rounds=120 --eval_every=4 \
      --out_dir=$out/fedbuff_$s
    python -m experiments.run $COMMON --system_profile=$profile --selector=$s --mode=async \
      --async_rule=fedasync --buffer_size=1 --concurrency=10 --rounds=600 --eval_every=20 \
      --out_dir=$out/fedasync_$s
  done
  python -m experiments.compare $out/* --target=0.85 --x=sim_time \
    --out=experiments/results/asynchronous_$population
done
