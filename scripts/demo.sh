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
"$AIRFLOW" dags test train_llama 2>&1 | tee "$DEMO_HOME/train_llama.log"
status=${PIPESTATUS[0]}
elapsed=$(( $(date +%s) - start ))
summary=$(ls -t "$AIRFLOW_HOME"/dtrain/checkpoints/*/summary.json 2>/dev/null | head -n 1 || true)
if [ "$status" -ne 0 ] || [ -z "$summary" ]; then
  echo "==> train_llama FAILED after ${elapsed}s; full log: $DEMO_HOME/train_llama.log" >&2
  exit 1
fi
echo
echo "==> train_llama succeeded in ${elapsed}s"
echo "    run summary:  $summary"
"$PY" - "$summary" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("    checkpoint:   %s" % s["latest_checkpoint"])
print("    final step %s, final loss %.4f, tokens seen %s, preemptions %s, steps lost %s"
      % (s["final_step"], s["final_loss"], s["tokens_seen"], s["preemptions"], s["steps_lost"]))
PYEOF
echo "    task log:     $DEMO_HOME/train_llama.log"
