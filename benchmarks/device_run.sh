#!/usr/bin/env bash
# What ran on the GPU machine (see RESULTS.md): CUDA tests, the Fig. 5 heat-map timing, the
# benchmark table. The machine has torch (CUDA) but no pydantic and no internet: wheels for
# it are carried in .dev/wheels (git-ignored; `pip download --no-deps pydantic==2.14.4 pydantic-core==2.50.5
# annotated-types==0.8.0 typing-inspection==0.4.5 --python-version 3.12 --only-binary=:all: -d .dev/wheels`). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp}  # scratch: wheels, unpacked data, runs (a CPU dry run names its own: /tmp is shared there)
SRC=${SRC:-src}  # the fedsl that runs: the tree's, or a commit's (`git archive C src | tar -x -C .dev`: .dev/src)
export PYTHONPATH=$(realpath "$SRC"):$WORK/lib
python3 -m pip install -q --no-index --no-deps --target "$WORK/lib" .dev/wheels/*.whl  # a carried .dev replaces the last call's
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, pydantic, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'pydantic', pydantic.__version__)" | tee -a "$OUT/machine.txt"
[ -f "$SRC/COMMIT" ] && echo "fedsl from $SRC at commit $(cat "$SRC/COMMIT")" | tee -a "$OUT/machine.txt"
unpack_data() {  # the carried CIFAR-10 and STL-10 into $WORK/data, unless a warm machine has them already
  for d in cifar10:cifar10-jpeg stl10:stl10-subset; do
    [ -f ".dev/${d%%:*}.npz" ] && [ ! -d "$WORK/data/${d#*:}" ] && \
      python3 benchmarks/device_data.py unpack ".dev/${d%%:*}.npz" "$WORK/data/${d#*:}"
  done
}
run_collect() {  # NAME, then `fedsl run` options. Runs them, stopped CALL_S (510) s after this script began less 20 s
                 # to pack (a stack cut off leaves nothing; one not started says so), then returns the text results
                 # (collect.py; the data folder written DATA, as in seed 0's group.json) as $OUT/NAME.tgz. Killed
                 # 10 s after its SIGTERM: the checkpoint SIGTERM writes (2.2 GB a SCAFFOLD run) is of no use here
  local name=$1 start=$SECONDS left=$(( ${CALL_S:-510} - SECONDS - 20 )) compile=cuda-graphs; shift
  python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || compile=off
  if [ "$left" -lt 60 ]; then echo "$name: not started, $left s left of CALL_S" | tee -a "$OUT/times.txt"; return; fi
  rm -rf "${WORK:?}/runs/$name" "$WORK/keep/$name"  # a retry on a warm machine starts afresh
  # shellcheck disable=SC2086  # EXTRA is several options
  timeout -k 10 "$left" python3 -m fedsl.cli run "$@" --set rounds="${ROUNDS:-1000}" --set compile=$compile \
    --set checkpoint_every=0 ${EXTRA:-} --data-dir "$WORK/data" --out "$WORK/runs/$name" -q 2>&1 | tail -4
  echo "$name: rc=${PIPESTATUS[0]} $(( SECONDS - start )) s rounds=${ROUNDS:-1000} compile=$compile" | tee -a "$OUT/times.txt"
  python3 reproduction/collect.py "$WORK/runs/$name" "$WORK/keep/$name" | cut -c1-200
  sed -i "s#\"data_dir\": \"$WORK/data\"#\"data_dir\": \"DATA\"#" "$WORK/keep/$name/group.json"
  tar czf "$OUT/$name.tgz" -C "$WORK/keep" "$name"
}
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
  fig5seed)  # issue 36 item 5: Fig. 5's seed SEED (1, then 2) at 1,000 rounds, as seed 0 ran (fig5-cifar10-full): each
             # variant's 20 runs (5 eta_l x 4 C) one stack; its results as $OUT/fig5-sSEED-VARIANT.tgz (a folder
             # fig5-sSEED-VARIANT; group.json's data folder written DATA, as seed 0's), wall times in $OUT/times.txt.
             # fedsl pinned to seed 0's commit, so that merge.py takes the seeds as one group (it wants equal configs,
             # and new config keys land in the tree often) and the tree's uncommitted edits stay out. Here, once:
             #   rm -rf .dev/src && git archive 5afdfbd src | tar -x -C .dev && git rev-parse 5afdfbd >.dev/src/COMMIT
             # (.dev: wheels 2.8 MB, cifar10.npz 18.5, stl10.npz 23.6, src 1.0: 46 MB, with the tree ~54 of 64 MiB).
             # Two calls a seed, one session a seed; make the second at once (warm: the data stays unpacked):
             #   run(command="SRC=.dev/src SEED=1 VARIANTS='FSL SCAFFOLD' bash benchmarks/device_run.sh fig5seed",
             #       carry=[".dev"], timeout_s=540)
             #   run(command="SRC=.dev/src SEED=1 VARIANTS='FedDyn FSLsyn' bash benchmarks/device_run.sh fig5seed",
             #       carry=[".dev"], timeout_s=540)
             # Expected on one H100, from seed 0's times (same code and shapes; fig5-cifar10-full/times.txt):
             #   call 1: FSL 185 s + SCAFFOLD 106 s = 291 s, + unpacking (7 s on this 2-core CPU) + pip, nvidia-smi
             #           and torch's import (~15 s) + collect and tar (~5 s a variant) = ~320 s = ~5.3 min
             #   call 2: FedDyn 114 s + FSLsyn 177 s = 291 s, + the same less unpacking = ~5.2 min
             #   session: machine start 1-2 min + 5.3 + 5.2 = ~12-13 of its 15 min (~14 if the machine went back
             #   between the calls and started again). CALL_S=510 stops the last variant before timeout_s would.
             # Then here: reproduction/fig5-cifar10-full/README.md, "Seeds 1 and 2" (merged beside seed 0).
             # CPU dry run (2 rounds, the quick grid; python3 = the venv's; WORK its own, /tmp is shared here):
             #   PATH=$PWD/.venv/bin:$PATH WORK=/tmp/t36 OUT=/tmp/t36/out SRC=.dev/src SEED=1 ROUNDS=2 \
             #     VARIANTS="FSL SCAFFOLD FedDyn FSLsyn" EXTRA="--quick --set threads=1" bash benchmarks/device_run.sh fig5seed
             # took 171 s with the unpacking, 105 s without; VARIANTS=SCAFFOLD at the whole grid (EXTRA="--set
             # threads=1") 289 s, and its folder merged beside a copy of seed 0's (rounds, threads, compile reset).
    unpack_data
    for v in ${VARIANTS:?VARIANTS: e.g. "FSL SCAFFOLD"}; do
      run_collect "fig5-s${SEED:?SEED: 1 or 2}-$v" --preset fig5-cifar10 --variants "$v" --set "seeds=[$SEED]" \
        --set eval_every=10
    done
    ls -la "$OUT"
    ;;
  table1tune)  # issue 36 item 5: Table 1's tuning as the paper did it, preset table1-cifar10-tuning (1,000 rounds, C = 2,
               # each method's eta_l its best cell at C = 2 in fig5-cifar10-full: FSL 0.02 (0.625), FSLsyn 0.02 (0.613),
               # FedDyn 0.05 (0.626); seed 0, the one seed that grid ran, so the tuning sees the draw (partition,
               # sampling, init) that picked eta_l, and its gamma = 1 / alpha = 0.01 runs repeat table1-cifar10-full's
               # seed 0 on the GPU; a pick on seed 0 then reported over seeds 0-2 favours it a little on seed 0).
               # PARTS FSL = FSL-250, FSL-500, FSLsyn-504,
               # FSLsyn-720 x gamma in {0.6, 0.8, 1.0, 1.2} (16 runs, one stack: gamma is the server's), FedDyn =
               # alpha in {0.01, 0.05, 0.1, 0.5} (4 runs, 4 stacks of one: alpha enters the clients' step, which a
               # stack shares). Results as $OUT/t1tune-PART.tgz. fedsl pinned to a commit that has the preset:
               #   C=$(git rev-parse HEAD); rm -rf .dev/src && git archive $C src | tar -x -C .dev && echo $C >.dev/src/COMMIT
               # One session, two calls:
               #   run(command="SRC=.dev/src PARTS=FSL bash benchmarks/device_run.sh table1tune", carry=[".dev"], timeout_s=540)
               #   run(command="SRC=.dev/src PARTS=FedDyn bash benchmarks/device_run.sh table1tune", carry=[".dev"], timeout_s=540)
               # Expected on one H100 (this preset not timed yet; from seed 0's Fig. 5 stacks of 20):
               #   call 1: FSL's 20 runs at K0 = 50 took 185 s; a stack pads every run's server steps to its largest
               #           K0, 72 (FSLsyn-720), so <= 185 x 72/50 = 266 s for these 16, + ~30 s (unpacking, pip, tar)
               #           = ~3.5-5 min
               #   call 2: one FedDyn run alone is host-bound, 0.033-0.040 s a round (RESULTS-gpu.md, R = 1, H200):
               #           33-40 s + ~15 s set-up = ~55 s, x 4 = 220 s, + ~15 s = ~4 min; at worst a run alone costs
               #           what a stack of 20 did (114 s): 456 s, still inside CALL_S. Each alpha's stack ends on its
               #           own, so a call cut off keeps the alphas before it
               #   session: start 1-2 min + ~4.5 + ~4 = ~10-11 of 15 min. One call for both would not fit 9 min at
               #   the upper bounds (266 + 456 s).
               # Then here (T: where the tgz files were unpacked):
               #   python reproduction/merge.py reproduction/table1-cifar10-tuning T/t1tune-FSL T/t1tune-FedDyn
               # CPU dry run (2 rounds, the whole grid of 20 runs at full size):
               #   PATH=$PWD/.venv/bin:$PATH WORK=/tmp/t36 OUT=/tmp/t36/out SRC=.dev/src ROUNDS=2 EXTRA="--set threads=1" \
               #     bash benchmarks/device_run.sh table1tune
               # took 326 s (FSL part 260 s, FedDyn 53 s); the two folders merged, and `fedsl report` read them.
    unpack_data
    for part in ${PARTS:-FSL FedDyn}; do
      case $part in FSL) vs=FSL-250,FSL-500,FSLsyn-504,FSLsyn-720 ;; *) vs=$part ;; esac
      run_collect "t1tune-$part" --preset table1-cifar10-tuning --variants "$vs"
    done
    ls -la "$OUT"
    ;;
  table1tuned)  # issue 48 item 7: Table 1 tuned on validation data (preset table1-cifar10-tuned): each method's paper grid
                # (FedDyn alpha, FSL/FSLsyn gamma; 4 points, each once: tune.sampler = 'grid') judged on 10% of each
                # client's samples held out, at 1,000 rounds on seed 0, then 3 fresh seeds (1-3) at each choice on the
                # whole training data, judged on the test set (`fedsl run --tuned`: OUT/tune holds the studies).
                # A part's grid points are asked at once and run as one stack (tune.stack = 4: a run alone is
                # host-bound on the GPU, 0.033-0.040 s a round, RESULTS-gpu.md; a stack of 4 costs about one run),
                # in PAR processes (default 1). A grid is the paper's: a choice at its end is reported (fedsl show
                # marks it), not widened. fedsl pinned to a commit that has the preset:
                #   C=$(git rev-parse HEAD); rm -rf .dev/src && git archive $C src | tar -x -C .dev && echo $C >.dev/src/COMMIT
                # One session, two calls (PARTS FSL = FSL-250, FSL-500, FSLsyn-504, FSLsyn-720; FedDyn):
                #   run(command="SRC=.dev/src PARTS=FSL bash benchmarks/device_run.sh table1tuned", carry=[".dev"], timeout_s=540)
                #   run(command="SRC=.dev/src PARTS=FedDyn bash benchmarks/device_run.sh table1tuned", carry=[".dev"], timeout_s=540)
                # Expected on one H200 (not timed yet): call 1: 4 stacks of 4 trials, ~60 s each = ~240 s, then 12 runs
                # (4 stacks of 3 seeds, ~60 s each) = ~240 s, + ~30 s set-up = ~8.5 min; call 2: one stack of 4 trials
                # ~60 s + 3 seeds stacked ~60 s + ~30 s = ~2.5 min; session ~11 of 15 min. A call cut off resumes: the same call
                # again continues the study (`fedsl run --tuned` reopens OUT/tune) if the machine stayed warm.
                # Results: $OUT/t1tuned-PART.tgz (the group, as collect.py keeps it) and t1tuned-PART-tune.tgz (study.db,
                # tune.json, best.json and the trials' text files). Then here (T: where they were unpacked):
                #   copy T/t1tuned-FSL and T/t1tuned-FedDyn under reproduction/table1-cifar10-tuned/ (merge.py joins them)
                # CPU dry run (2 rounds, the quick form; python3 = the venv's; WORK its own):
                #   PATH=$PWD/.venv/bin:$PATH WORK=/tmp/t48 OUT=/tmp/t48/out ROUNDS=2 EXTRA="--quick --set threads=1" PAR=1 \
                #     bash benchmarks/device_run.sh table1tuned
                # took 106 s (FSL part 65 s, FedDyn 25 s: 2 grid points each, then seed 1; both folders collected).
    unpack_data
    for part in ${PARTS:-FSL FedDyn}; do
      case $part in FSL) vs=FSL-250,FSL-500,FSLsyn-504,FSLsyn-720 ;; *) vs=$part ;; esac
      run_collect "t1tuned-$part" --preset table1-cifar10-tuned --variants "$vs" --tuned --parallel "${PAR:-1}" \
        --set tune.stack="${STACK:-4}"
      tar czf "$OUT/t1tuned-$part-tune.tgz" --exclude checkpoint.pt -C "$WORK/runs/t1tuned-$part" tune
    done
    ls -la "$OUT"
    ;;
  shakespeare)  # Shakespeare's full-size form (preset shakespeare-full: 644 roles, LEAF's char-LSTM 2 x 256, S = 10, K = 50)
                # on the GPU, a stack of the variant's 3 seeds at a time (the vectorised executor vmaps the plain LSTM).
                # The texts travel packed (4 MB; the device has no internet):
                #   python benchmarks/device_data.py pack ../shared/data/shakespeare .dev/shakespeare.npz
                #   run(command="VARIANTS=FSL,FedAvg bash benchmarks/device_run.sh shakespeare", carry=[".dev"], timeout_s=540)
                # ROUNDS (default 1000) as every entry; a call holds about 8 minutes of runs, so 1,000 rounds of two
                # variants need the timing first: ROUNDS=20 once, then the rounds that fit. CUDA graphs capture the
                # K local steps when CUDA is there; EXTRA="--set compile=off" if a capture fails.
                # CPU dry run (2 rounds, the quick form; python3 = the venv's; WORK its own):
                #   python benchmarks/device_data.py pack ../shared/data/shakespeare .dev/shakespeare.npz
                #   PATH=$PWD/.venv/bin:$PATH WORK=/tmp/sk49 OUT=/tmp/sk49/out ROUNDS=2 \
                #     EXTRA="--quick --set threads=1 --set executor=vectorised" bash benchmarks/device_run.sh shakespeare
                # took 53 s on 2 loaded cores (FSL and FedAvg, seed 0, stacked alone; both collected).
    [ -f .dev/shakespeare.npz ] && [ ! -d "$WORK/data/shakespeare" ] && \
      python3 benchmarks/device_data.py unpack .dev/shakespeare.npz "$WORK/data/shakespeare"
    run_collect shakespeare-full --preset shakespeare-full --variants "${VARIANTS:-FSL,FedAvg}" --set stack=3
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
