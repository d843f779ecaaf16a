"""`make` installs TensorFlow's GPU build where nvidia-smi lists a GPU, and the CPU build elsewhere.

tools/tf_extra.sh makes the choice from `nvidia-smi -L`; the Makefile's `TF_EXTRA` runs it (`make
tf-extra` prints what `make` would install). Each test runs the script, or make, with a PATH that
holds only the tools it uses and, where the case has one, an `nvidia-smi` written by the test:
the command and its output are the interface, and a shell script is a real one. The GPU build
itself cannot be installed on a machine without GPUs.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "tf_extra.sh"

A100 = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5a1d2b3c-0000-1111-2222-333344445555)"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running."
)


def _path(tmp_path, nvidia_smi=None):
    """A PATH of symbolic links to the tools the script and make use, and, if given, an
    `nvidia-smi` whose body is the shell text `nvidia_smi` (it answers `-L` only)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sh", "echo", "grep", "head", "sleep", "timeout", "make"):
        (tools / tool).symlink_to(shutil.which(tool))
    if nvidia_smi is not None:
        fake = tools / "nvidia-smi"
        fake.write_text(f'#!/bin/sh\n[ "$1" = -L ] || {{ echo "unexpected: $*" >&2; exit 2; }}\n{nvidia_smi}\n')
        fake.chmod(0o755)
    return str(tools)


def _choose(tmp_path, nvidia_smi=None, command=("sh", str(SCRIPT)), **env):
    done = subprocess.run(
        list(command),
        cwd=ROOT,
        env={"PATH": _path(tmp_path, nvidia_smi), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


CASES = {
    "one GPU": (f"echo '{A100}'", "gpu", None),
    "two GPUs, one split by MIG": (
        f"echo '{A100}'; echo '  MIG 1g.5gb Device 0: (UUID: MIG-1)'; echo 'GPU 1: Tesla T4 (UUID: GPU-2)'",
        "gpu",
        None,
    ),
    "no nvidia-smi": (None, "cpu", None),
    "no driver": (f"echo '{NO_DRIVER}'; exit 9", "cpu", "nvidia-smi -L failed (exit status 9: NVIDIA-SMI has failed"),
    "no GPU": ("echo 'No devices found.'; exit 6", "cpu", "failed (exit status 6: No devices found.)"),
    "a listing without GPUs": ("exit 0", "cpu", "nvidia-smi -L lists no GPU"),
    "no answer": ("sleep 30", "cpu", "nvidia-smi -L gave no answer within 1 s"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_script_picks_gpu_only_where_nvidia_smi_lists_a_gpu(tmp_path, case):
    nvidia_smi, extra, said = CASES[case]
    chosen, stderr = _choose(tmp_path, nvidia_smi, NVIDIA_SMI_TIMEOUT_S="1")
    assert chosen == extra
    if said is None:
        assert stderr == ""
    else:  # a machine whose GPUs TensorFlow will not see is told so, and how to override
        assert said in stderr and "make TF_EXTRA=gpu" in stderr, stderr


@pytest.mark.parametrize("case", ["one GPU", "no nvidia-smi", "no driver"])
def test_make_installs_the_extra_the_script_picks(tmp_path, case):
    nvidia_smi, extra, _ = CASES[case]
    assert _choose(tmp_path, nvidia_smi, command=("make", "-s", "tf-extra"))[0] == extra


def test_make_takes_the_extra_given_by_hand(tmp_path):
    assert _choose(tmp_path, f"echo '{A100}'", command=("make", "-s", "tf-extra", "TF_EXTRA=cpu"))[0] == "cpu"


def test_make_refuses_an_extra_that_is_not_cpu_or_gpu(tmp_path):
    # -B: the recipe runs even where .venv is up to date; it stops before it creates anything.
    done = subprocess.run(
        ["make", "-B", f"VENV={tmp_path / 'venv'}", f"{tmp_path / 'venv'}/.installed", "TF_EXTRA=tpu"],
        cwd=ROOT,
        env={"PATH": _path(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "make: TF_EXTRA='tpu': give cpu or gpu" in done.stderr
    assert not (tmp_path / "venv").exists()
