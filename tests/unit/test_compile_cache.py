"""Each job of the local backend compiles into a cache of its own, kept for its next attempt."""

from __future__ import annotations

import os
import stat
import time

from airflow_dtrain.launchers.state_dir import COMPILE_CACHE_MAX_AGE_S, compile_cache_env


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


def test_a_cache_no_job_launched_from_for_a_month_is_removed_at_the_next_launch(tmp_path):
    old = compile_cache_env(tmp_path, "team-a", "finished-long-ago")["TORCHINDUCTOR_CACHE_DIR"]
    recent = compile_cache_env(tmp_path, "team-a", "ran-last-week")["TORCHINDUCTOR_CACHE_DIR"]
    (tmp_path.resolve() / ".compile-cache" / "a-file").write_text("not a cache")
    for path in (old, recent):
        os.makedirs(os.path.join(path, "triton", "kernel"))  # what inductor writes below
    now = time.time()
    os.utime(old, (now, now - COMPILE_CACHE_MAX_AGE_S - 60))
    os.utime(recent, (now, now - 7 * 86400))

    mine = compile_cache_env(tmp_path, "team-b", "llama")["TORCHINDUCTOR_CACHE_DIR"]

    assert not os.path.exists(old), "a month unused: removed"
    assert os.path.isdir(os.path.join(recent, "triton", "kernel")) and os.path.isdir(mine)
    assert (tmp_path.resolve() / ".compile-cache" / "a-file").exists(), "only directories are caches"
    # launching a job again keeps its cache, however old, and makes it recent
    os.utime(recent, (now, now - COMPILE_CACHE_MAX_AGE_S - 60))
    again = compile_cache_env(tmp_path, "team-a", "ran-last-week")["TORCHINDUCTOR_CACHE_DIR"]
    assert again == recent and os.path.isdir(os.path.join(recent, "triton", "kernel"))
    assert time.time() - os.stat(recent).st_mtime < 60


def test_a_node_that_cannot_write_the_jobs_compile_cache_compiles_without_it(tmp_path, monkeypatch, capsys):
    """A volume the pods' group cannot write (a claim set up for another uid) costs a compile, not the run."""
    from trainer.launch import use_a_writable_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache" / "triton"))
    assert use_a_writable_compile_cache() and (tmp_path / "cache").is_dir()

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file" / "cache"))  # cannot be made
    assert not use_a_writable_compile_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "TRITON_CACHE_DIR" not in os.environ
    assert f"compile cache {tmp_path / 'file' / 'cache'} cannot be written" in capsys.readouterr().err
