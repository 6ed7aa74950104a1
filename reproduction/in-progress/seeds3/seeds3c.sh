#!/usr/bin/env bash
# After seeds3b.sh: the no-pretraining IID case (C = 10) at 3 seeds, FL, DS and FSL, 100 rounds.
set -u
cd /work/main
while pgrep -f "runs/seeds3b.sh" > /dev/null; do sleep 60; done
F=.venv/bin/fedsl
D="--data-dir /work/shared/data --set threads=1 --set checkpoint_every=10 --quiet"
if [ -d runs/nopre-c10-3seeds ]; then $F resume runs/nopre-c10-3seeds --quiet; else
$F run --preset appendix-no-pretrain --variants FL,DS,FSL --set rounds=100 --set 'seeds=[0,1,2]' \
    --set data.samples_per_client=500 --set 'sweep={"data.classes_per_client" = [10]}' --set eval_every=5 $D \
    --out runs/nopre-c10-3seeds; fi
echo "all done"
