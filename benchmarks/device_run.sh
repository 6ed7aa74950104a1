#!/usr/bin/env bash
# What ran on the GPU machine (see RESULTS.md): CUDA tests, the Fig. 5 heat-map timing, the
# benchmark table. The machine has torch (CUDA) but no pydantic and no internet: wheels for
# it are carried in .dev/wheels (git-ignored; `pip download --no-deps pydantic==2.14.4 pydantic-core==2.50.5
# annotated-types==0.8.0 typing-inspection==0.4.5 --python-version 3.12 --only-binary=:all: -d .dev/wheels`). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/lib
python3 -m pip install -q --no-index --no-deps --target /tmp/lib .dev/wheels/*.whl  # a carried .dev replaces the last call's
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, pydantic, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'pydantic', pydantic.__version__)" | tee -a "$OUT/machine.txt"
case "${1:-check}" in
  verify)  # CUDA tests of the current tree, then the heat-map timing (a baseline for issue 16)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda.py 2>&1 | tail -6 | tee "$OUT/cuda_tests.txt"
    timeout 200 python3 benchmarks/heatmap_time.py --device cuda --stack 1,20,60 --rounds 3 2>&1 | tee "$OUT/heatmap_time.md"
    ;;
  compile)  # issue 16: the stacked step eager vs captured (inductor, CUDA graphs), FSL and SCAFFOLD, few rounds
    timeout 100 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda.py tests/test_engine.py -k "cuda or captured" \
      2>&1 | tail -4 | tee "$OUT/cuda_tests.txt"
    timeout 420 python3 benchmarks/heatmap_time.py --device cuda --stack 20,60 --rounds 5 --methods FSL,SCAFFOLD \
      --compile off,reduce-overhead 2>&1 | tee "$OUT/heatmap_compile.md"
    ;;
  grid)  # issue 16: host waits removed, CUDA graphs, bf16 evaluation; phases vs the device's best rate; the plain
         # loop; then the real Fig. 5 command (FSL's 60 runs as one stack, real CIFAR-10) for ROUNDS rounds
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_engine.py \
      -k "cuda or bfloat16" 2>&1 | tail -8 | tee "$OUT/cuda_tests.txt"
    timeout "${GRID_S:-240}" python3 benchmarks/heatmap_time.py --device cuda --runs "${RUNS:-FSL:60,SCAFFOLD:30}" \
      --compile off,cuda-graphs --rounds "${TIMED:-100}" --budget-s 25 --extras rates,loop,evalloop \
      2>&1 | tee "$OUT/heatmap_grid.md"
    python3 benchmarks/device_data.py unpack .dev/cifar10.npz /tmp/data/cifar10-jpeg
    mode=cuda-graphs; grep -q "cuda-graphs | 60 | failed" "$OUT/heatmap_grid.md" && mode=off
    ( time timeout "${REPRO_S:-140}" python3 -m fedsl.cli run --preset fig5-cifar10 --variants FSL \
        --set rounds="${ROUNDS:-100}" --set compile=$mode --set eval_precision=bfloat16 --set stack=60 \
        --set checkpoint_every=0 --data-dir /tmp/data --out /tmp/fig5 -q ) 2>&1 | tail -8 | tee "$OUT/fig5_log.txt"
    tar czf "$OUT/fig5.tgz" --exclude checkpoint.pt -C /tmp fig5
    ;;
  next)  # what issue 16 left for the next device session (~6 min; carry .dev/wheels): the CUDA tests added since the
          # last one (host tables among them), the batched rule update's round times, and the runner's loop (round +
          # evaluation) with the next round's host work made ahead or not, interleaved. Then, as a second call,
          # `device_run.sh pfl` (~5 min; carry .dev/wheels and .dev/pfl-wheels): 11-12 of the 15 minutes in all
    timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_cuda.py 2>&1 | tail -8 \
      | tee "$OUT/cuda_tests.txt"
    timeout 260 python3 benchmarks/heatmap_time.py --device cuda --runs FSL:60,SCAFFOLD:30,FedDyn:30 \
      --compile cuda-graphs --rounds 100 --budget-s 20 --eval-precision float32 --extras rates,ahead \
      --ahead-rounds 3 2>&1 | tee "$OUT/heatmap_next.md"
    ;;
  pfl)  # issue 16 item 4 on the GPU: pfl-research beside fedsl and the plain loop. The machine cannot fetch
        # packages: carry .dev/pfl-wheels (`pip download "pfl==0.6.0" --python-version 3.12 --only-binary=:all:
        # --platform manylinux_2_28_x86_64 -d .dev/pfl-wheels`, then delete its numpy wheel: the image's numpy stays)
    python3 -m pip install -q --no-index --no-deps --target /tmp/lib .dev/pfl-wheels/*.whl
    timeout "${PFL_S:-300}" python3 benchmarks/bench.py --device cuda --peers fedsl,loop,pfl --rounds 5 --reps 2 --heavy-reps 1 \
      --workloads s2-cifar10+eval,s2-cifar10 --footprint-clients 0 --out "$OUT/bench_pfl_cuda.md" 2>&1 | tail -30
    ;;
  fig5full)  # issue 26 item 2: the whole Fig. 5 CIFAR-10 grid, 1,000 rounds x 3 seeds, a variant (60 runs, stacked) at a
             # time; each variant's text results (index, metrics.csv, summary.json; no checkpoint) come back as
             # $OUT/fig5-full-VARIANT.tgz as soon as it ends, its wall time in $OUT/fig5_full_times.txt. Carry .dev
             # (wheels 2.8 MB, cifar10.npz 18.5 MB, stl10.npz 23.6 MB: with the tree < 64 MiB). A stack's runs end
             # together: one cut off by VARIANT_S leaves nothing, so time a variant's rounds first (heatmap_time.py)
             # and split the variants over calls. CPU dry run (2 rounds, the quick grid; python3 = the venv's):
             # ROUNDS=2 EXTRA=--quick VARIANTS="FSL FSLsyn SCAFFOLD FedDyn" bash benchmarks/device_run.sh fig5full
    [ -f .dev/cifar10.npz ] && [ ! -d /tmp/data/cifar10-jpeg ] && \
      python3 benchmarks/device_data.py unpack .dev/cifar10.npz /tmp/data/cifar10-jpeg
    [ -f .dev/stl10.npz ] && [ ! -d /tmp/data/stl10-subset ] && \
      python3 benchmarks/device_data.py unpack .dev/stl10.npz /tmp/data/stl10-subset
    compile=cuda-graphs; python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || compile=off
    for v in ${VARIANTS:-FSL FSLsyn SCAFFOLD FedDyn}; do
      start=$(date +%s)
      # shellcheck disable=SC2086  # EXTRA is several --set options
      timeout "${VARIANT_S:-540}" python3 -m fedsl.cli run --preset fig5-cifar10 --variants "$v" \
        --set rounds="${ROUNDS:-1000}" --set compile=$compile --set eval_every=10 --set checkpoint_every=0 \
        ${EXTRA:-} --data-dir /tmp/data --out "/tmp/fig5-full/$v" -q 2>&1 | tail -4
      echo "$v: $(( $(date +%s) - start )) s, rounds=${ROUNDS:-1000}" | tee -a "$OUT/fig5_full_times.txt"
      python3 reproduction/collect.py "/tmp/fig5-full/$v" "/tmp/keep/fig5-full-$v" | cut -c1-200
      tar czf "$OUT/fig5-full-$v.tgz" -C /tmp/keep "fig5-full-$v"
    done
    ls -la "$OUT"
    ;;
  check)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/cuda_tests.txt"
    timeout 170 python3 benchmarks/heatmap_time.py --device cuda --stack 1,20,60 --rounds 2 2>&1 | tee "$OUT/heatmap_time.md"
    timeout 140 python3 benchmarks/bench.py --device cuda --peers fedsl,loop --rounds 5 --reps 2 --heavy-reps 1 \
      --workloads s2-cifar10+eval,s2-cifar10,s1-cifar10,s2-emnist+eval,s2-cifar10-8seeds+eval,eval-cifar10 \
      --footprint-clients 0 --out "$OUT/bench_cuda.md" 2>&1 | tail -30
    ;;
  scaffold)  # the SCAFFOLD half of the Fig. 5 run below (the first call ran out of time on it)
    python3 benchmarks/device_data.py unpack .dev/cifar10.npz /tmp/data/cifar10-jpeg
    ( time timeout "${REPRO_S:-120}" python3 -m fedsl.cli run --preset fig5-cifar10 --variants SCAFFOLD \
        --set rounds="${ROUNDS:-200}" --set 'seeds=[0]' --set checkpoint_every=0 --data-dir /tmp/data \
        --out /tmp/fig5 -q ) 2>&1 | tail -5 | tee "$OUT/fig5_log.txt"
    tar czf "$OUT/fig5.tgz" --exclude checkpoint.pt -C /tmp fig5
    ;;
  repro)  # Fig. 5 (CIFAR-10, Scenario 2) for FSL and SCAFFOLD, one seed, stacked runs, shortened horizon
    python3 benchmarks/device_data.py unpack .dev/cifar10.npz /tmp/data/cifar10-jpeg
    ( time timeout "${REPRO_S:-215}" python3 -m fedsl.cli run --preset fig5-cifar10 --variants FSL,SCAFFOLD \
        --set rounds="${ROUNDS:-200}" --set 'seeds=[0]' --set checkpoint_every=0 --data-dir /tmp/data \
        --out /tmp/fig5 -q ) 2>&1 | tail -25 | tee "$OUT/fig5_log.txt"
    tar czf "$OUT/fig5.tgz" --exclude checkpoint.pt -C /tmp fig5
    timeout 60 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda.py -k run_resume 2>&1 | tail -3 \
      | tee "$OUT/cuda_tests.txt"
    ;;
esac
