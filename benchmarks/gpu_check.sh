#!/usr/bin/env bash
# The GPU figures of benchmarks/RESULTS.md, as run on a lent GPU machine (one GPU, python3 with CUDA torch).
#   bash benchmarks/gpu_check.sh mfu     # llama3_1b tokens/s and MFU: eager, compiled, loss compiled, whole logits
#   bash benchmarks/gpu_check.sh async   # the trainer's async saves on llama3_1b: each save's cost_s
#   bash benchmarks/gpu_check.sh mfu-large # micro-batch 8 and 16 (about 60 GiB of GPU memory at 16)
# Output goes to $OUT (or ./gpu-out) as one text file per part.
set -u
part=${1:-mfu}
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

run() {  # run NAME ARGS...: one measurement, bounded, its wall time printed
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    timeout "${RUN_TIMEOUT:-150}" "$@" 2>&1 | grep -v -E 'Warning|warn\(' | tail -"${TAIL:-8}"
    echo "== $name: rc ${PIPESTATUS[0]}, ${SECONDS}s total, $((SECONDS - t0))s this run"
}

case $part in
mfu)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        run eager $py benchmarks/mfu.py --no-compile
        run compiled-blocks $py benchmarks/mfu.py --no-compile-loss
        run compiled-blocks-and-loss $py benchmarks/mfu.py
        run compiled-whole-logits $py benchmarks/mfu.py --loss-chunk-tokens 0
    } | tee "$out/mfu.txt"
    ;;
mfu-large)
    {
        run compiled-mb16-whole-logits $py benchmarks/mfu.py --micro-batch 16 --loss-chunk-tokens 0
        run compiled-mb8-whole-logits $py benchmarks/mfu.py --micro-batch 8 --loss-chunk-tokens 0
        run compiled-mb16 $py benchmarks/mfu.py --micro-batch 16
    } | tee "$out/mfu_large.txt"
    ;;
async)
    rm -rf /tmp/ck-async
    RUN_TIMEOUT=${RUN_TIMEOUT:-400} TAIL=100000 run async-1b $py -m trainer --flavor llama3_1b --steps 320 \
        --set data.seq_len=2048 --set micro_batch_size=4 --set global_batch_size=4 --set checkpoint.every=100 \
        --set checkpoint.keep=1 --set metrics.log_every=1 --set parallel.compile=false \
        --checkpoint-uri /tmp/ck-async > "$out/async.txt"
    grep -E '"checkpoint"|WARN|warn|waited|== ' "$out/async.txt" | cut -c1-600
    rm -rf /tmp/ck-async
    ;;
*)
    echo "unknown part $part (mfu, mfu-large, async)" >&2; exit 2 ;;
esac
