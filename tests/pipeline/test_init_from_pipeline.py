"""train_llama with init_from (real Airflow, dag.test(), real torchrun processes): continued pre-training
of a Hugging Face Llama built locally with transformers, end to end on the local backend, promoted and
exported with the source's shape."""

from __future__ import annotations

import json
import uuid

import pytest
from airflow.utils.state import DagRunState

from airflow_dtrain.trust.ownership import owner_for, owner_segment
from tests.hf_model_assets import tiny_llama
from tests.hf_tokenizer_assets import tiny_tokenizer
from trainer.data.builtin_text import builtin_documents

pytestmark = pytest.mark.torchrun
transformers = pytest.importorskip("transformers", reason="transformers is in the `test` extra of setup.cfg")


def test_train_llama_continues_a_hugging_face_model_and_exports_it(dags, tmp_path):
    """`init_from` alone: the prepare_data task tokenises the built-in text with the model's own tokenizer."""
    src = tiny_llama(tmp_path / "my-llama", n_kv_heads=2, tie=False)
    tiny_tokenizer(
        src, vocab_size=256, corpus=builtin_documents()[:300]
    )  # the model directory's tokenizer files
    ckpt, registry = tmp_path / "ckpt", tmp_path / "registry"
    # a byte-level job's best model in the same registry (loss 2.14, measured with another tokenizer on other
    # data): this job's model is exported and becomes the best of its own job and evaluation set all the same
    # (dag.test() runs are triggered by "dag_test": its jobs lie in that user's part of the registry)
    mine = registry / "owners" / owner_segment(owner_for("dag_test", "train_llama"))
    byte_entry = mine / "train-llama" / "eval-0123456789ab"
    byte_entry.mkdir(parents=True)
    (mine / "train-llama" / "owner.json").write_text(
        json.dumps({"owner": "user:dag_test", "job": "train-llama", "kind": "registry"})
    )
    (byte_entry / "best.json").write_text(json.dumps({"loss": 2.14, "step": 60}))
    job = f"hf-{uuid.uuid4().hex[:8]}"
    run = dags["train_llama"].test(run_conf={
        "job": job, "init_from": src, "checkpoint_uri": str(ckpt),
        "registry_uri": str(registry), "steps": 6, "checkpoint_every": 3, "num_nodes": 1,
        "simulate_preemption_at_step": 0, "budget_usd": 5.0, "local_spot_price": 0.5, "max_price": 1.0,
    })  # fmt: skip
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    manifest = json.loads(sorted(ckpt.glob("step-*/manifest.json"))[-1].read_text())
    assert manifest["step"] == 6 and manifest["config"]["model"]["init_from"] == src
    assert manifest["model_args"]["dim"] == 64 and manifest["model_args"]["n_kv_heads"] == 2
    prepared = run.get_task_instance("prepare_data").xcom_pull(task_ids="prepare_data")
    assert manifest["config"]["data"]["dataset"] == prepared and prepared != "builtin"
    assert manifest["tokenizer"]["kind"] == "hf" and manifest["tokenizer"]["name"] == "my-llama"

    # the job's own registry entry, on its evaluation set; the DAG run says what it exported and that it is
    # the best
    (best_file,) = mine.glob(f"{job}/eval-*/best.json")
    best = json.loads(best_file.read_text())
    assert (
        best_file.parent.parent.name == job
        and json.loads((byte_entry / "best.json").read_text())["loss"] == 2.14
    )
    evaluation = run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate")
    assert evaluation["promoted"] is True and evaluation["export"] == best["export"], evaluation
    exported = transformers.AutoModelForCausalLM.from_pretrained(best["export"])
    source = json.loads((tmp_path / "my-llama" / "config.json").read_text())
    assert exported.config.hidden_size == source["hidden_size"]
    assert exported.config.num_key_value_heads == source["num_key_value_heads"]
    assert exported.config.vocab_size == source["vocab_size"]
    # The export carries the model's tokenizer: it loads with AutoTokenizer and the model generates text.
    tokenizer = transformers.AutoTokenizer.from_pretrained(best["export"])
    assert tokenizer.eos_token == "<|end_of_text|>"
    prompt = tokenizer("The small cat", return_tensors="pt")
    out = exported.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 8
    assert tokenizer.decode(out[0]).startswith("The small cat")
