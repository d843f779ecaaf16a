"""baechi_tf: fast, memory-aware device placement for TensorFlow graphs (Baechi, SoCC 2020)."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

# The compiled engine of the list scheduler (baechi_tf.placer.engine). Optional: without a C++
# compiler the install goes on and the Python engine runs, with one warning saying how to fix it.
# No fused multiply-add: the schedules must be bit-identical to the Python engine's.
native = Pybind11Extension(
    "baechi_tf.placer._native",
    ["baechi_tf/placer/native/scheduler.cpp"],
    depends=[
        "baechi_tf/placer/native/executor.hpp",
        "baechi_tf/placer/native/gaps.hpp",
        "baechi_tf/placer/native/pieces.hpp",
        "baechi_tf/placer/native/sct_policy.hpp",
        "baechi_tf/placer/native/windows.hpp",
    ],
    cxx_std=17,
    extra_compile_args=["-O2", "-ffp-contract=off"],
)
native.optional = True

# One TensorFlow version for both extras: the GPU build runs the code that the CPU build tests.
TENSORFLOW = "2.21.0"

setup(
    name="baechi_tf",
    version="0.1.0",
    description="Device placement for TensorFlow graphs with m-TOPO, m-ETF and m-SCT",
    python_requires=">=3.11",
    packages=find_packages(include=["baechi_tf", "baechi_tf.*"]),
    package_data={"baechi_tf": ["proto/*.proto"]},
    ext_modules=[native],
    cmdclass={"build_ext": build_ext},
    # TensorFlow comes from an extra, one of two builds at the same version: `baechi_tf[cpu]`
    # (tensorflow-cpu) or `baechi_tf[gpu]` (tensorflow with NVIDIA's CUDA libraries). Without
    # either, the TensorFlow-free core (the placers, `baechi place-json`) works, and the TF ends
    # stop at their import with an error that names both extras (baechi_tf/rewriter/__init__.py).
    install_requires=[
        "numpy==2.4.6",
        "scipy==1.17.1",
        "highspy==1.16.0",  # HiGHS's interior point without crossover (baechi_tf.sct.solvers)
        "cvxopt==1.3.3",
        "protobuf==7.36.2",
        "absl-py==2.5.1",
        "matplotlib==3.11.2",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TENSORFLOW}"],
        "gpu": [f"tensorflow[and-cuda]=={TENSORFLOW}"],
        "mosek": ["Mosek==11.2.7"],
        # The docs tools are here too: tests/test_docs.py builds the site with --strict.
        "test": [
            "pytest==9.2.0",
            "pytest-xdist==3.8.0",  # make test spreads the suite over the cores
            "hypothesis==6.170.17",
            "mkdocs==1.6.1",
            "mkdocs-material==9.8.2",
            "mkdocstrings[python]==1.0.8",
            "mkdocstrings-python==2.0.11",
        ],
        # Only to regenerate baechi_tf/proto/*_pb2.py (committed); its protoc matches protobuf 7.x.
        "proto": ["grpcio-tools==1.85.1"],
    },
    entry_points={"console_scripts": ["baechi=baechi_tf.cli:console_main"]},
)
