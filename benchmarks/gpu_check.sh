#!/usr/bin/env bash
# The GPU figures of benchmarks/RESULTS.md, as run on a lent GPU machine (one GPU, python3 with CUDA torch).
#   bash benchmarks/gpu_check.sh mfu     # llama3_1b tokens/s and MFU: eager, compiled, loss compiled, whole logits
#   bash benchmarks/gpu_check.sh async   # the trainer's async saves on llama3_1b: each save's cost_s
#   bash benchmarks/gpu_check.sh mfu-large # micro-batch 8 and 16 (about 60 GiB of GPU memory at 16)
#   bash benchmarks/gpu_check.sh e2e     # the trainer at its fastest settings with async saves, then the held-out
#                                        # evaluation with --all and the export twice (the second reuses), and the
#                                        # exported model's loss under transformers on the same batches
#   bash benchmarks/gpu_check.sh preempt # SIGTERM to trainer.launch at the fastest settings while an async save is in
#                                        # flight: exit 75, the restart resumes from the step reached (recovery.py)
#   bash benchmarks/gpu_check.sh preempt-warm # the same preemption without a save in flight, compiled, the restart
#                                        # with the first run's compile cache (warm) and with an empty one (cold)
#   bash benchmarks/gpu_check.sh resize-warm  # an elastic node's resize on one GPU, compiled: its workers restarted
#                                        # under the live agent in the kept processes, beside new processes with
#                                        # the job's warm compile cache (DTRAIN_KEEP_WORKERS=0)
#   bash benchmarks/gpu_check.sh warm-join # a joining node's warm-up in a fake world of 16 on llama3_1b, compiled,
#                                        # then its first round on the GPU: 0 graphs compiled? (studies/warm_join_check.py)
#   bash benchmarks/gpu_check.sh save    # a 14 GB state on the GPU (llama3_1b's size): the sync save against a
#                                        # fsync'd write of the same bytes, the first async save (buffers allocated
#                                        # ahead and not), the later ones; needs about 3 x 14 GB free in /tmp
#   bash benchmarks/gpu_check.sh lent    # for a lease of 15 minutes of device time, all tries together: the two
#                                        # restarts still unmeasured, one round each, each part started only if
#                                        # the time left ($LENT_S, 420 s, from the script's start) can hold it:
#                                        # resize-warm's kept processes (issue #39: the figure spot_cost.py's
#                                        # --rerendezvous-s and --grow-resize-s wait on), then preempt-warm (#40)
#   bash benchmarks/gpu_check.sh --quick # `make bench-smoke`: mfu.py and recovery.py --quick on the GPU, exit 1
#                                        # if either fails; without a GPU, says so and exits 0
# Output goes to $OUT (or ./gpu-out) as one text file per part (--quick: to stdout only).
set -u
part=${1:-mfu}
out=${OUT:-gpu-out}
[ "$part" = --quick ] || mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

run() {  # run NAME ARGS...: one measurement, bounded, its wall time printed
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    timeout "${RUN_TIMEOUT:-150}" "$@" 2>&1 | grep -v -E 'Warning|warn\(' | tail -"${TAIL:-8}"
    local rc=${PIPESTATUS[0]}
    echo "== $name: rc $rc, ${SECONDS}s total, $((SECONDS - t0))s this run"
    return "$rc"
}

# The llama3_1b run that preempt-warm, resize-warm and lent restart (FLAVOR, SEQ, MB to change it).
model=(--flavor "${FLAVOR:-llama3_1b}" --set "data.seq_len=${SEQ:-2048}" --set "micro_batch_size=${MB:-16}"
    --set "global_batch_size=${MB:-16}" --set parallel.loss_chunk_tokens=0 --set checkpoint.every=1000)
preempt_warm() {  # restart after a preemption, compiled, with the job's compile cache and with an empty one
    run preempt-warm-1b $py benchmarks/recovery.py --rounds 1 --nproc 1 --no-elastic --compile --at-step 10 \
        --stderr "$out/preempt_warm_stderr.txt" "${model[@]}"
}
resize_warm() {  # resize_warm ARGS...: an elastic node's resize in its kept processes (recovery.py --in-place)
    run resize-warm-1b $py benchmarks/recovery.py --nproc 1 --in-place --compile --no-elastic --at-step 10 \
        --stderr "$out/resize_warm_stderr.txt" "$@" "${model[@]}"
}

case $part in
--quick)
    if ! $py -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        echo "gpu_check.sh --quick: skipped: no GPU here (torch.cuda.is_available() is not True for $py)"
        exit 0
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    rc=0
    run mfu-quick $py benchmarks/mfu.py --quick || rc=1
    run preempt-quick $py benchmarks/recovery.py --quick --nproc 1 || rc=1
    exit $rc
    ;;
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
e2e)
    ck=/tmp/ck-e2e hf=/tmp/hf-e2e
    rm -rf $ck $hf /tmp/eval-e2e.json
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "transformers", transformers.__version__)'
        git log -1 --format='code of %h' 2>/dev/null
        RUN_TIMEOUT=${RUN_TIMEOUT:-300} TAIL=100000 run train $py -m trainer --flavor ${FLAVOR:-llama3_1b} --steps 120 \
            --set data.seq_len=${SEQ:-2048} --set micro_batch_size=${MB:-16} --set global_batch_size=${MB:-16} \
            --set parallel.compile=${COMPILE:-true} \
            --set parallel.loss_chunk_tokens=0 --set checkpoint.every=40 --set checkpoint.keep=2 \
            --set metrics.log_every=10 --checkpoint-uri $ck
        for i in 1 2; do
            TAIL=30 run evaluate-$i $py -m trainer.evaluate --checkpoint-uri $ck --all --batches 4 --batch-size 4 \
                --out /tmp/eval-e2e.json --export-to $hf
        done
        TAIL=20 run hf-parity $py - $ck $hf <<'PY'
import json, sys, torch, torch.nn.functional as F
from transformers import AutoModelForCausalLM
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import TrainConfig
from trainer.data.loader import eval_batches
from trainer.evaluate import local_dataset
ours = json.load(open("/tmp/eval-e2e.json"))
root = CheckpointDir(sys.argv[1])
manifest = root.manifest(dict(root.committed())[ours["step"]])
cfg = TrainConfig.from_dict(manifest["config"])
model = AutoModelForCausalLM.from_pretrained(ours["export"]["out"], dtype=torch.float32).to("cuda" if torch.cuda.is_available() else "cpu").eval()
total, n = 0.0, 0
with torch.no_grad():
    for x, y in eval_batches(local_dataset(cfg.data.dataset), cfg.data.seq_len, 4, 4, torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        total += F.cross_entropy(model(x).logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
        n += y.numel()
print(json.dumps({"step": ours["step"], "trainer_eval_loss": ours["loss"], "hf_loss": total / n,
                  "rel_diff": abs(total / n - ours["loss"]) / ours["loss"], "exported": ours["export"]["files"],
                  "curve": ours["eval_curve"]}))
PY
    } > "$out/e2e.txt" 2>&1
    grep -E '"checkpoint"|"event": "(export|save|stop)|"step": (2|10|40|80|120),|waited|reused|== |rel_diff|torch|code of|name' "$out/e2e.txt" | cut -c1-700
    rm -rf $ck $hf
    ;;
preempt)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        RUN_TIMEOUT=${RUN_TIMEOUT:-420} TAIL=20 run preempt-1b $py benchmarks/recovery.py --rounds 1 --nproc 1 \
            --at-step 43 --stderr "$out/preempt_stderr.txt" --flavor ${FLAVOR:-llama3_1b} --set data.seq_len=${SEQ:-2048} \
            --set micro_batch_size=${MB:-16} --set global_batch_size=${MB:-16} --set parallel.compile=${COMPILE:-true} \
            --set parallel.loss_chunk_tokens=0 --set checkpoint.every=40
    } 2>&1 | tee "$out/preempt.txt"
    ;;
save)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        df -h "${TMPDIR:-/tmp}"
        RUN_TIMEOUT=${RUN_TIMEOUT:-560} TAIL=20 run save-14gb $py benchmarks/checkpoint.py --device cuda \
            --mb ${STATE_MB:-4700} --rounds ${ROUNDS:-2} --lean
    } 2>&1 | tee "$out/save.txt"
    ;;
preempt-warm)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        RUN_TIMEOUT=${RUN_TIMEOUT:-540} TAIL=20 preempt_warm
    } 2>&1 | tee "$out/preempt_warm.txt"
    ;;
resize-warm)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        RUN_TIMEOUT=${RUN_TIMEOUT:-540} TAIL=20 resize_warm --rounds 2 --compare-env DTRAIN_KEEP_WORKERS=0
    } 2>&1 | tee "$out/resize_warm.txt"
    ;;
lent)
    # One device call (timeout_s 450) in a lease of 900 s that pays for the machine's start too; the shorter
    # part first. What does not fit is said, not started: a part cut off by its timeout gives no figure.
    budget=${LENT_S:-420}
    fits() {  # fits NAME NEED_S: is there time left for a part that needs about NEED_S seconds?
        local left=$((budget - SECONDS))
        if [ "$left" -ge "$2" ]; then RUN_TIMEOUT=$left; return 0; fi
        echo "== $1: skipped, ${left}s left of ${budget}s and it needs about $2 s"
        return 1
    }
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
        git log -1 --format='code of %h' 2>/dev/null
        # an elastic node's resize in its kept processes (#39): the survivors' pause at a loss or a join
        fits resize-warm "${RESIZE_NEED_S:-150}" && TAIL=6 resize_warm --rounds 1
        # restart after a preemption, compiled, with the job's compile cache and with an empty one (#40)
        fits preempt-warm "${PREEMPT_NEED_S:-240}" && TAIL=12 preempt_warm
        echo "== lent: ${SECONDS}s of ${budget}s"
    } 2>&1 | tee "$out/lent.txt"
    ;;
warm-join)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        RUN_TIMEOUT=${RUN_TIMEOUT:-540} TAIL=6 run warm-join-1b $py benchmarks/studies/warm_join_check.py --world 16 \
            --flavor ${FLAVOR:-llama3_1b} --set data.seq_len=${SEQ:-2048} --set micro_batch_size=${MB:-4} \
            --set global_batch_size=$((16 * ${MB:-4})) --set parallel.loss_chunk_tokens=0 \
            --set checkpoint.every=1000  # a rank of 16 trains one micro-batch of MB rows, as the GPU's one does
    } 2>&1 | tee "$out/warm_join.txt"
    ;;
*)
    echo "unknown part $part (mfu, mfu-large, async, e2e, preempt, preempt-warm, resize-warm, warm-join, save," \
        "lent, --quick)" >&2
    exit 2 ;;
esac
