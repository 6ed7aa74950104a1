#!/usr/bin/env bash
# The second core: the no-pretraining group taken on to 300 rounds (FL and DS do not reach 0.5 in 150), then Fig. 3 CIFAR-10.
set -u
cd /work/main
F=.venv/bin/fedsl
D="--data-dir /work/shared/data --set threads=1 --set checkpoint_every=10 --quiet"
$F resume runs/nopre-c2-3seeds --rounds 300 --quiet
if [ -d runs/fig3-cifar10-3seeds ]; then $F resume runs/fig3-cifar10-3seeds --quiet; else
$F run --preset fig3-cifar10 --variants FSL-S4 --set rounds=100 --set data.samples_per_client=500 \
    --set 'sweep={"server.gamma"=[0.5, 2.0], "algorithm.local_lr"=[0.01]}' --set 'seeds=[0,1,2]' --set eval_every=5 $D --out runs/fig3-cifar10-3seeds; fi
echo "all done"
