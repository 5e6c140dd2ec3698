#!/usr/bin/env bash
# `make demo`: run train_llama end to end on this machine with a throwaway Airflow.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PY:=.venv/bin/python}"
: "${DEMO_HOME:=$PWD/.demo}"
export AIRFLOW_HOME="$DEMO_HOME/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export DTRAIN_DATA_DIR="$DEMO_HOME/data"
mkdir -p "$AIRFLOW_HOME"
AIRFLOW="$(dirname "$PY")/airflow"

echo "==> Airflow home: $AIRFLOW_HOME (sqlite)"
"$AIRFLOW" db migrate > "$DEMO_HOME/db-migrate.log" 2>&1
start=$(date +%s)
echo "==> airflow dags test train_llama (2 nodes x 1 process, debug flavour, a simulated preemption)"
set +e
# A job of its own per demo: a second `make demo` trains again instead of continuing (and finding
# complete) the job of the first one.
"$AIRFLOW" dags test train_llama --conf "{\"job\": \"demo-$(date +%Y%m%d-%H%M%S)\"}" 2>&1 | tee "$DEMO_HOME/train_llama.log"
status=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - start ))
# newest first; a run acts for its triggering user (dag.test(): "dag_test"), whose jobs lie under owners/
newest() { find "$1" -path "$2" -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -n 1 | cut -d' ' -f2-; }
summary=$(newest "$AIRFLOW_HOME/dtrain/checkpoints/train_llama" '*/summary.json')
if [ "$status" -ne 0 ] || [ -z "$summary" ]; then
  echo "==> train_llama FAILED after ${elapsed}s; full log: $DEMO_HOME/train_llama.log" >&2
  exit 1
fi
echo
echo "==> What happened (from the task logs):"
grep -E 'status: step|Decision: |simulating preemption|"reason": "preemption"|"event": "preempted"|relaunching from|"event": "resume"|Held-out loss|Promoted|not the best of job' \
  "$DEMO_HOME/train_llama.log" | sed -E 's/^[0-9TZ:.-]+ \[[a-z ]+\] //; s/ \[airflow[^]]*\].*$//' | cut -c1-200 | sed 's/^/    /' || true
echo
echo "==> train_llama succeeded in ${elapsed}s"
echo "    run summary:  $summary"
best=$(newest "$AIRFLOW_HOME/dtrain/models/train_llama" '*/eval-*/best.json')
"$PY" - "$summary" "${best:-none}" <<'PYEOF'
import json, os, sys
s = json.load(open(sys.argv[1]))
print("    checkpoint:   %s" % s["latest_checkpoint"])
print("    final step %s, final loss %.4f, tokens seen %s, preemptions %s, steps lost %s, cost $%.4f"
      % (s["final_step"], s["final_loss"], s["tokens_seen"], s["preemptions"], s["steps_lost"], s.get("dollars", 0)))
print("    report:       %s (and report.html beside it)" % os.path.join(os.path.dirname(sys.argv[1]), "report.png"))
if os.path.exists(sys.argv[2]):
    best = json.load(open(sys.argv[2]))
    print("    best model:   held-out loss %.4f (perplexity %.2f) at step %s" % (best["loss"], best["perplexity"], best["step"]))
    print("    exported to:  %s (Hugging Face safetensors)" % best["export"])
PYEOF
echo "    task log:     $DEMO_HOME/train_llama.log"
