#!/bin/sh
# Prints the extra of baechi_tf whose TensorFlow build this machine can use: `gpu`
# (tensorflow[and-cuda]) when `nvidia-smi -L` lists at least one GPU, else `cpu` (tensorflow-cpu).
# No nvidia-smi, an nvidia-smi that fails (no driver) or lists no GPU, and one that has not
# answered within $NVIDIA_SMI_TIMEOUT_S seconds (default 20) all give `cpu`; the last two also say
# so on stderr, since that machine may have GPUs that its TensorFlow will then not see.
# The Makefile installs `.[<this>,test,mosek]`; `make TF_EXTRA=cpu` (or gpu) chooses by hand.
#
# nvidia-smi -L prints a line per GPU, such as "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)".

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo cpu
    exit 0
fi
limit=${NVIDIA_SMI_TIMEOUT_S:-20}
if command -v timeout >/dev/null 2>&1; then
    listing=$(timeout "$limit" nvidia-smi -L 2>&1)
else
    listing=$(nvidia-smi -L 2>&1)
fi
status=$?
if [ "$status" -eq 0 ] && printf '%s\n' "$listing" | grep -q '^GPU [0-9]'; then
    echo gpu
    exit 0
fi
if [ "$status" -eq 124 ]; then
    why="gave no answer within $limit s"
elif [ "$status" -ne 0 ]; then
    why="failed (exit status $status: $(printf '%s\n' "$listing" | head -n 1))"
else
    why="lists no GPU"
fi
echo "tools/tf_extra.sh: nvidia-smi -L $why; installing TensorFlow for CPUs" \
    "(make TF_EXTRA=gpu installs the GPU build)" >&2
echo cpu
