"""Each job of the local backend compiles into a cache of its own, kept for its next attempt."""

from __future__ import annotations

import stat

from airflow_dtrain.launchers.state_dir import compile_cache_env


def test_a_jobs_attempts_share_its_compile_cache_and_no_other_job_or_owner_does(tmp_path):
    first = compile_cache_env(tmp_path, "team-a", "llama")
    again = compile_cache_env(tmp_path, "team-a", "llama")  # the relaunch after a preemption
    other_job = compile_cache_env(tmp_path, "team-a", "llama-2")
    other_owner = compile_cache_env(tmp_path, "team-b", "llama")
    assert again == first
    dirs = {env["TORCHINDUCTOR_CACHE_DIR"] for env in (first, other_job, other_owner)}
    assert len(dirs) == 3, dirs
    cache = tmp_path.resolve() / ".compile-cache"
    for env in (first, other_job, other_owner):
        path = cache / env["TORCHINDUCTOR_CACHE_DIR"].rsplit("/", 1)[1]
        assert str(path) == env["TORCHINDUCTOR_CACHE_DIR"] and path.is_dir()
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o700, "only this user's processes may write compiled code"
        assert env["TRITON_CACHE_DIR"] == str(path / "triton")


def test_a_job_name_cannot_lead_its_cache_out_of_the_state_directory(tmp_path):
    env = compile_cache_env(tmp_path / "groups", "", "../../etc")
    path = env["TORCHINDUCTOR_CACHE_DIR"]
    assert path.startswith(str((tmp_path / "groups" / ".compile-cache").resolve()) + "/"), path
    assert "/../" not in path
