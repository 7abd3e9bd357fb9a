#!/bin/sh
# Every selector on one heterogeneous setting (docs/papers/selection.md, 'Results'): digits split
# over 50 clients by Dirichlet(0.1) labels, 25 available a round, K = 10, an MLP, log-normal
# speeds and bandwidths on the simulated clock, 60 rounds, seeds 0, 1, 2 (one batch per method).
# Writes runs/selection/<method>/ and experiments/results/selection_methods.md (+ figures).
set -e
COMMON="--dataset=digits --partition=dirichlet --dirichlet_alpha=0.1 --num_clients=50
  --num_available=25 --clients_per_round=10 --model=mlp --hidden=64 --rounds=60 --seeds=0,1,2
  --system_profile=lognormal --eval_every=2 --overwrite"
for s in random poc divfl entropy grad_norm oort pyramidfl md afl clustered_size \
         clustered_similarity exp3 fedcs tifl refl ocs delta fedcor; do
  python -m experiments.run --selector=$s $COMMON --out_dir=runs/selection/$s
done
# OCS uploads 3/32 of its cohort by default; with half of it, at the others' order of uploads.
python -m experiments.run --selector=ocs --ocs_budget=0.5 $COMMON --out_dir=runs/selection/ocs_half
python -m experiments.compare runs/selection/* --target=0.8 \
  --out=experiments/results/selection_methods
