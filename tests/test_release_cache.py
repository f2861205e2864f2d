"""The cache of releases: several rca processes at once on an empty cache (a CI matrix, `pytest -n`)
share each download, and a release the index does not have is refused at once, leaving nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rca.inputs.versions import Nearest, nearest_releases
from tests.conftest import CASES

pytestmark = pytest.mark.release


def test_four_parallel_cold_runs_all_succeed_with_the_same_diagnosis(tmp_path: Path) -> None:
    environment = {**os.environ, "RCA_CACHE_DIR": str(tmp_path / "cache")}
    command = [
        sys.executable,
        "-m",
        "rca",
        "diagnose",
        "--case",
        str(CASES / "kimi-k25-consistent"),
        "--format",
        "json",
        "-q",
    ]
    runs = [
        subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [(run.wait(timeout=900), *run.communicate()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0, 0, 0], [error for _, _, error in results]
    assert len({output for _, output, _ in results}) == 1
    assert sorted(path.name for path in (tmp_path / "cache" / "src").iterdir()) == [
        "sglang-0.5.12",
        "speculators-0.4.0",
    ]
    assert not (tmp_path / "cache" / "wheels").exists()  # downloads are removed once unpacked


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("speculators==9.9.9", "speculators has no release 9.9.9 on the package index (nearest: "),
        ("no-such-package-rca==1.0", "there is no package 'no-such-package-rca' on the package index"),
    ],
)
def test_a_release_the_index_does_not_have_is_refused_at_once(tmp_path: Path, spec: str, says: str) -> None:
    environment = {**os.environ, "RCA_CACHE_DIR": str(tmp_path / "cache")}
    target = CASES / "kimi-k25-consistent" / "target"
    command = [sys.executable, "-m", "rca", "diagnose", "-q", "--serving", spec, "--target", str(target)]
    start = time.perf_counter()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert result.returncode == 2 and result.stderr.startswith("rca: error: ") and says in result.stderr, result.stderr
    assert elapsed < 10, f"{elapsed:.1f} s to refuse {spec}"  # the index answers in one round trip
    left = [path for path in (tmp_path / "cache").rglob("*") if path.parent.name != "locks" and path.name != "locks"]
    assert left == [], left


def test_an_unknown_release_is_answered_with_its_neighbours_by_version() -> None:
    index_order = [f"0.5.{minor}" for minor in (6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23)]
    index_order = index_order[:4] + index_order[-1:] + index_order[4:-1] + ["not-a-version"]  # as an index lists them
    nearest = nearest_releases("0.5.99", index_order)
    assert nearest.nearest == ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
    assert (nearest.closest, nearest.latest) == ("0.5.23", "0.5.23")
    between = nearest_releases("0.5.13.1", index_order, around=2)
    assert between.nearest == ("0.5.12", "0.5.13", "0.5.14", "0.5.15") and between.closest == "0.5.13"
    assert nearest_releases("0.1", index_order).closest == "0.5.6"  # older than all: the oldest
    assert nearest_releases("1.0", []) == Nearest((), None, None)
