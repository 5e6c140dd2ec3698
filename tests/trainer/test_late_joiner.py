"""A node that comes once its elastic group has ended (a replacement that warmed up while the group finished,
trainer/elastic/warm_join.py) finds the rendezvous closed: it exits 0 and says so, not 1 as a launcher error,
which
would mark a group that trained to the end as failed. A real ``trainer.launch`` agent and a real rendezvous
store process (``trainer.elastic.rdzv_store``, as an elastic group's)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from conftest import FAST, REPO, trainer_env

pytestmark = pytest.mark.torchrun


def test_a_node_that_comes_after_its_group_ended_exits_0_having_trained_nothing(data_dir, tmp_path):
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = subprocess.Popen([sys.executable, "-m", "trainer.elastic.rdzv_store", "127.0.0.1", str(port)],
                             cwd=REPO,
                             env=trainer_env(data_dir), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        store.stdout.readline()  # serving
        endpoint = f"127.0.0.1:{port}"
        params = RendezvousParameters("c10d", endpoint, "late", 1, 2, is_host=False)
        get_rendezvous_handler(params).set_closed()  # what the group's last agent does as it ends
        late = subprocess.run(
            [sys.executable, "-m", "trainer.launch", "--nnodes", "1:2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "late", "--rdzv-conf",
             "is_host=0", "--max-restarts", "3", "-m", "trainer", *FAST, "--steps", "4",
             "--checkpoint-uri", str(tmp_path / "ckpt")],
            cwd=REPO, env=trainer_env(data_dir), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        store.terminate()
        store.wait()
    said = late.stdout + late.stderr
    assert late.returncode == 0, said
    assert "[trainer.launch] exit 0: the group had ended before this node joined" in said
    assert "[trainer] rank" not in said  # it joined no process group, trained nothing
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
