"""Parsing a DAG that uses the spot sensors and the budget branch imports neither boto3 nor kubernetes."""

from __future__ import annotations

import subprocess
import sys


def test_spot_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        "from airflow_dtrain import BudgetBranchOperator, SpotInterruptionSensor, SpotPriceSensor\n"
        "import airflow_dtrain.spot.offers, airflow_dtrain.spot.members\n"
        "import airflow_dtrain.spot.interruptions, airflow_dtrain.interruption_watch\n"
        "import airflow_dtrain.aws.prices, airflow_dtrain.aws.sqs, airflow_dtrain.kubernetes.nodes\n"
        "SpotPriceSensor(task_id='p', instance_types=['p3.2xlarge'], max_price=1.0)\n"
        "SpotInterruptionSensor(task_id='w', group='g', instance_ids=['i-0123456789abcdef0'], sqs_queue_url='http://q')\n"
        "BudgetBranchOperator(task_id='b', spot_task_id='s', on_demand_task_id='o', total_steps=10)\n"
        "heavy = ('boto3', 'botocore', 'kubernetes', 'torch')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
