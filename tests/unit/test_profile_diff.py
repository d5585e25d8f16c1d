"""bench/profile_diff.py: calls per job from real cProfile stats of two "trees"."""

import cProfile

from bench.profile_diff import calls, report


def _step() -> int:
    return 1


def _extra() -> int:
    return 2


def _job(extra: bool) -> None:
    _step()
    if extra:
        _extra()


def _profile(path: str, jobs: int, extra: bool) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(jobs):
        _job(extra)
    prof.disable()
    prof.dump_stats(path)
    return path


def test_calls_per_job_and_the_function_that_differs(tmp_path) -> None:
    before = _profile(str(tmp_path / "before.prof"), 1000, extra=False)
    after = _profile(str(tmp_path / "after.prof"), 1000, extra=True)
    assert calls([before])["test_profile_diff.py:_step"] == 1000
    lines = report({"before": [before], "after": [after]}, 1000)
    # _job and _step per job in both, _extra only after
    assert lines[0] == "before: 2.0 Python calls per job on the per-job path"
    assert lines[1] == "after: 3.0 Python calls per job on the per-job path"
    assert lines[2].startswith("calls per job, before -> after")
    assert lines[3].split() == ["0.000", "1.000", "test_profile_diff.py:_extra"]
    assert len(lines) == 4  # nothing else differs


def test_several_files_add_up(tmp_path) -> None:
    a = _profile(str(tmp_path / "a.prof"), 300, extra=False)
    b = _profile(str(tmp_path / "b.prof"), 700, extra=False)
    assert calls([a, b])["test_profile_diff.py:_step"] == 1000
