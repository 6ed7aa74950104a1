#!/usr/bin/env bash
# The one-seed reduced figures again at 3 seeds (0-2), one run at a time on one core.
# Resume any of them with `fedsl resume runs/NAME`; then collect (reproduction/collect.py) and write the pages.
set -u
cd "$(dirname "$0")/../../.."
F=.venv/bin/fedsl
D="--data-dir ../shared/data --set threads=1 --set checkpoint_every=10 --quiet"
EM="--set data.emnist_split=bymerge --set data.carve=true --set data.train_per_class=315 --set data.test_per_class=100"
run() { out=$1; shift; if [ -d "runs/$out" ]; then $F resume "runs/$out" --quiet; else $F run "$@" $D --out "runs/$out"; fi; }
run nopre-c2-3seeds --preset appendix-no-pretrain --variants FL,DS,FSL --set rounds=150 --set 'seeds=[0,1,2]' \
    --set data.samples_per_client=500 --set 'sweep={"data.classes_per_client" = [2]}' --set eval_every=5
run fig2-emnist-3seeds --preset fig2-emnist --variants FL,DS,FSL-g1 $EM --set rounds=100 \
    --set data.samples_per_client=300 --set 'sweep={"data.classes_per_client"=[2]}' --set 'seeds=[0,1,2]' --set eval_every=5
run fig3-emnist-3seeds --preset fig3-emnist --variants DS-S5,FSL-S5 $EM --set rounds=100 --set data.samples_per_client=300 \
    --set 'sweep={"server.gamma"=[0.5,1.0,2.0], "algorithm.local_lr"=[0.01]}' --set 'seeds=[0,1,2]' --set eval_every=5
run fig3-cifar10-3seeds --preset fig3-cifar10 --variants FSL-S4 --set rounds=100 --set data.samples_per_client=500 \
    --set 'sweep={"server.gamma"=[0.5, 2.0], "algorithm.local_lr"=[0.01]}' --set 'seeds=[0,1,2]' --set eval_every=5
echo "all done"
