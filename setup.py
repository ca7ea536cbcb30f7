"""Installs monet: the four top-level folders become one namespace (see DESIGN.md, "Layout")."""
from setuptools import setup

setup(
    name="monet",
    version="0.1.0",
    description="Memory-optimised training: checkpointing and operator choice by integer linear programming",
    python_requires=">=3.10",
    packages=["monet", "monet.solver", "monet.profiling", "monet.zoo", "monet.zoo.models"],
    package_dir={
        "monet": "monet",
        "monet.solver": "solver",
        "monet.profiling": "profiling",
        "monet.zoo": "zoo",
        "monet.zoo.models": "zoo/models",
    },
    package_data={"monet.zoo": ["profiles/*", "schedules/*", "index.json"]},
    install_requires=[
        # torch is pinned: an unpinned torch pulls several GB of CUDA wheels on a CPU machine.
        "torch==2.13.0",
        "numpy",
        "pandas",
        "cvxpy",
        "cylp",
        "pulp",
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        "test": ["pytest", "highspy", "pyscipopt"],
        "solvers": ["highspy", "pyscipopt"],
    },
    entry_points={"console_scripts": ["monet=monet.cli:main"]},
)
