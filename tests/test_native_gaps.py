"""The compiled core's tree of gap widths, checked in C++ against sorted vectors (see
tests/native/gaps_check.cpp), with sanitizers when the compiler has them."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILER = shutil.which("g++") or shutil.which("c++")


@pytest.mark.slow
@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler (the python engine runs instead)")
def test_the_tree_of_gaps_books_and_searches_as_sorted_lists(tmp_path):
    binary = str(tmp_path / "gaps_check")
    source = os.path.join(ROOT, "tests", "native", "gaps_check.cpp")
    include = os.path.join(ROOT, "baechi_tf", "placer", "native")
    base = [COMPILER, "-std=c++17", "-O1", "-ffp-contract=off", "-I", include, source, "-o", binary]
    sanitized = subprocess.run(base + ["-fsanitize=address,undefined"], capture_output=True, text=True)
    if sanitized.returncode != 0:  # no sanitizer runtime: the check itself still runs
        subprocess.run(base, check=True, capture_output=True, text=True)
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok ") and int(proc.stdout.split()[1]) > 2_000_000, proc.stdout
