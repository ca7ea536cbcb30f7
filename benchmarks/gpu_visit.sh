#!/usr/bin/env bash
# The GPU work of issue 35, as one command per visit of a GPU machine (H100/H200, the GPU image's
# Python 3.12 and torch 2.11.0+cu130, no network).  Prepare here once (wheels of cvxpy, cylp, highspy
# into .whl/ and an env script into .gpu/, made where there is network), then run with the device tool, carrying .whl:
#
#     bash benchmarks/gpu_visit.sh first            # decisive runs, about 9 minutes
#     bash benchmarks/gpu_visit.sh second [MODELS]  # after "first": probe, cuda tests, numerics, measure solved MODELS
#     bash benchmarks/gpu_visit.sh third            # after "second": cuDNN BatchNorm checks, full-mode trace, new profile
#     bash benchmarks/gpu_visit.sh table MODELS     # measure solved schedules (after `gpu_table.py --step solve` here)
#     bash benchmarks/gpu_visit.sh compiled         # monet compiled against torch.compile: GPT-2, Llama (bf16, fp32)
#
# "first": the `cuda` tests; the gradient experiments (benchmarks/gpu_numerics.py: TF32, BatchNorm,
# the first module where the captured forward parts from eager); the per-node CUDA memory traces of
# ResNet-50 and GPT-2 (benchmarks/gpu_traces.py, to commit under tests/data/traces/); the executor's
# own cost at a 100 % budget (benchmarks/executor_tax.py --device cuda); H100 profiles of MONeT's
# models and GPT-2 (benchmarks/gpu_table.py --step profile, into zoo/profiles/).  Each step runs under
# its own timeout and its log, exit status and seconds go to $OUT/steps.txt, so one failing step does
# not lose the others.  Everything else comes back in one archive, $OUT/visit-<phase>.tar.gz (the
# device tool returns at most 8 files).
#
# "table MODELS" (comma-separated, default all six): benchmarks/gpu_table.py --step measure on the
# schedules solved on a CPU into gpu_work/ (carry it), writing gpu_work/*/measure.json and the table.
#
# monet is installed the way issue 36 promises for an offline CUDA machine:
# `pip install --no-build-isolation --no-deps -e .` (the image has setuptools and wheel), the
# solver's wheels from .whl/ into /tmp/site.
set -uo pipefail
phase=${1:-first}
models=${2:-resnet50,googlenet,unet,mobilenet_v2,vgg16,gpt2-small}
: "${OUT:?OUT must name the folder whose files come back}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
work=$(mktemp -d /tmp/visit.XXXXXX)
steps="$OUT/steps.txt"
export PYTHONUNBUFFERED=1
t_start=$(date +%s)

step() {  # step NAME TIMEOUT_S COMMAND...: run it, log to $work/NAME.log, record rc and seconds
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - t_start )) s)" | tee -a "$steps"
  tail -n 3 "$work/$name.log" | sed "s/^/    $name: /"
}

{
  echo "phase $phase on $(hostname), $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
} | tee "$steps"

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
step install 120 python3 -m pip install --no-build-isolation --no-deps -e .
python3 -c "import torch, monet.solver.solve, monet.compat as c; print('torch', torch.__version__, torch.cuda.get_device_name(), c.numerics())" \
  2>&1 | tee -a "$steps"

case "$phase" in
  first)
    step cuda_tests 200 python3 -m pytest -m cuda -n 0 -q -p no:cacheprovider tests/
    step numerics 150 python3 benchmarks/gpu_numerics.py --out "$work"
    step traces 240 python3 benchmarks/gpu_traces.py --out "$work/traces"
    step executor_tax 100 python3 benchmarks/executor_tax.py --device cuda --target-s 3
    left=$(( 540 - ($(date +%s) - t_start) ))
    for m in ${models//,/ }; do  # H100 profiles, as long as time is left
      [ "$left" -gt 45 ] || { echo "profile $m: skipped, $left s left" | tee -a "$steps"; continue; }
      step "profile_$m" $(( left - 30 )) python3 benchmarks/gpu_table.py --step profile --models "$m" --device cuda \
        --work-dir "$work/gpu_work"
      left=$(( 540 - ($(date +%s) - t_start) ))
    done
    mkdir -p "$work/profiles" && cp zoo/profiles/*.csv "$work/profiles/" 2>/dev/null
    ;;
  second)  # after the first visit: the fixes of its failures, the decisive numerics, ResNet-50's row
    step probe 60 python3 benchmarks/gpu_probe.py --out "$work/probe.json"
    step cuda_tests 200 python3 -m pytest -m cuda -n 0 -q -p no:cacheprovider --basetemp "$work/pytest" tests/
    step numerics 170 python3 benchmarks/gpu_numerics.py --out "$work" --models resnet50 --where-first \
      --numerics default,fp32_deterministic,fp32_no_cudnn --candidates plain,aot_eager,monet_keep_all
    if [ -d gpu_work ]; then
      cp -r gpu_work "$work/"
      for m in ${models//,/ }; do
        [ -f "gpu_work/$m/solve.json" ] || continue
        left=$(( 560 - ($(date +%s) - t_start) ))
        [ "$left" -gt 60 ] || { echo "measure $m: skipped, $left s left" | tee -a "$steps"; continue; }
        step "measure_$m" $(( left - 20 )) python3 benchmarks/gpu_table.py --step measure --models "$m" --device cuda \
          --work-dir "$work/gpu_work" --out "$work/gpu_table.md" --repeats 5 --compile-budgets ""
      done
    fi
    ;;
  third)  # after "second": cuDNN's BatchNorm on CUDA (tests, executor tax), the full-mode trace, a new profile
    step cuda_tests 260 python3 -m pytest -m cuda -n 0 -q -p no:cacheprovider tests/
    step executor_tax 90 python3 benchmarks/executor_tax.py --device cuda --rows cuda-resnet50-b184 --target-s 3
    step traces 120 python3 benchmarks/gpu_traces.py --out "$work/traces" --only resnet50-184-5GB-full
    left=$(( 560 - ($(date +%s) - t_start) ))
    step profile_resnet50 $(( left > 60 ? left - 20 : 40 )) python3 benchmarks/gpu_table.py --step profile \
      --models resnet50 --device cuda --work-dir "$work/gpu_work" --profiles-dir "$work/profiles"
    ;;
  table)
    [ -d gpu_work ] || { echo "gpu_work/ (the solved schedules) was not carried" | tee -a "$steps"; exit 2; }
    cp -r gpu_work "$work/"
    for m in ${models//,/ }; do
      left=$(( 560 - ($(date +%s) - t_start) ))
      [ "$left" -gt 60 ] || { echo "measure $m: skipped, $left s left" | tee -a "$steps"; continue; }
      step "measure_$m" $(( left - 20 )) python3 benchmarks/gpu_table.py --step measure --models "$m" --device cuda \
        --work-dir "$work/gpu_work" --out "$work/gpu_table.md"
    done
    ;;
  compiled)  # monet.optimize(compile=True) against torch.compile's peers (benchmarks/compiled.py), on CUDA
    step compiled_gpt2 300 python3 benchmarks/compiled.py --device cuda --models gpt2 --layers 12 --dtypes bf16,fp32 \
      --hidden 768 --seq 1024 --batch 8 --vocab 50257 --time-limit 30 --csv "$work/compiled-cuda.csv"
    left=$(( 560 - ($(date +%s) - t_start) ))
    step compiled_llama $(( left > 60 ? left - 20 : 40 )) python3 benchmarks/compiled.py --device cuda --models llama \
      --layers 12 --dtypes bf16 --hidden 1024 --seq 1024 --batch 4 --vocab 32000 --time-limit 30 \
      --csv "$work/compiled-cuda.csv"
    ;;
  *) echo "unknown phase $phase (first, second, third, table, compiled)" >&2; exit 2 ;;
esac

tar czf "$OUT/visit-$phase.tar.gz" -C "$work" . && ls -la "$OUT"
echo "done in $(( $(date +%s) - t_start )) s" | tee -a "$steps"
