"""Async saves allocate their host buffers ahead of the first save, and the first save still holds the state
of its own step, not the warm-up's."""

from __future__ import annotations

import torch

from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.state import checkpoint_tensors
from trainer.config.sections import CheckpointConfig


class _Position:
    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _step(model, optimizer) -> None:
    model(torch.randn(4, 64)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _buffers(ckpt: Checkpointer) -> set[int]:
    """The stager's host buffers of the weights and AdamW's moments (16 KiB each), one per tensor storage it
    has copied (DCP's cache of them; the RNG states are new tensors at every save, their buffers too)."""
    cached = ckpt._saver._get_stager()._state_dict_stager._cached_storage_mapping.values()
    return {id(b) for b in cached if b.nbytes() >= 16 * 1024}


def test_the_first_save_reuses_buffers_allocated_ahead_and_saves_its_own_step(gloo_group, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = (model, optimizer, scheduler, _Position())
    cfg = CheckpointConfig(uri=str(tmp_path / "ckpt"), async_save=True, every=2)
    ckpt = Checkpointer(cfg, flavor="test", config={}, config_hash="0", rank=0, world_size=1)
    try:
        _step(model, optimizer)  # the optimizer's moments exist from the first step on
        assert ckpt.warm_up_staging(*state, step=1)
        assert not ckpt.warm_up_staging(*state, step=1), "once per run"
        ckpt._saver.warm_up.result()
        ahead = _buffers(ckpt)
        assert len(ahead) == 6, "a buffer per weight and AdamW moment"

        _step(model, optimizer)  # step 2 changes every tensor the warm-up copied
        expected = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
        ckpt.save(2, *state, manifest_fields={}, reason="interval")
        ckpt.wait_for_staging()
        ckpt.wait()
        assert _buffers(ckpt) == ahead, "the first save allocated host buffers of its own"
    finally:
        ckpt.close()
    saved = checkpoint_tensors(str(tmp_path / "ckpt" / "step-00000002"))
    for name, tensor in expected.items():
        assert torch.equal(saved[name], tensor), f"{name}: the save holds the warm-up's copy, not step 2"
