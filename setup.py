"""Installs monet: the four top-level folders become one namespace (docs/design.md, "Layout")."""
from setuptools import setup

setup(
    name="monet",
    version="0.1.0",
    description="Memory-optimised training: checkpointing and operator choice by integer linear programming",
    python_requires=">=3.10",
    packages=["monet", "monet.cli", "monet.compat", "monet.impls", "monet.solver", "monet.profiling", "monet.zoo", "monet.zoo.models"],
    package_dir={
        "monet": "monet",
        "monet.solver": "solver",
        "monet.profiling": "profiling",
        "monet.zoo": "zoo",
        "monet.zoo.models": "zoo/models",
    },
    package_data={"monet.zoo": ["profiles/*", "schedules/*", "index.json"]},
    install_requires=[
        # A range, not a pin, so that `pip install -e .` keeps a GPU machine's own CUDA torch.  Every
        # admitted release was run (README, "Tested PyTorch releases"): 2.11.0, 2.13.0, 2.14.1 and
        # 2.15.0.  What moves between them (AOTAutograd's partitioner helpers, Dynamo's export,
        # backend flags, the profiler's event tree) is in monet/compat/, whose SUPPORTED range is
        # this one (tests/test_compat.py checks both agree).  The README's commands still say
        # `torch==2.13.0`, which makes pip take this project's CPU build instead of the newest
        # release with several GB of CUDA wheels.
        "torch>=2.11,<2.16",
        "numpy",
        "pandas",
        "cvxpy",
        "cylp",
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        # the reach suite (tests/test_reach.py) runs real models from these three libraries; with
        # the README's `pip install torch==2.13.0 -e '.[test]'` they resolve against that torch
        # (torchvision 0.28.0; 0.26.0 for 2.11, 0.29.1 for 2.14, each pinning its torch); bounded so
        # that a new release cannot ask for another torch.  torch 2.15.0 has no torchvision (nor
        # timm, which needs it) yet: install the project there without [test] (README, "Tested
        # PyTorch releases"); their tests skip.  wheel: setuptools < 70.1 builds editable installs
        # with it (tests/test_install.py)
        # accelerate: transformers.Trainer needs it (tests/test_trainer.py)
        "test": ["pytest", "pytest-xdist", "wheel", "highspy", "pyscipopt", "torchvision>=0.26,<0.30", "timm==1.0.31",
                 "transformers==5.24.0", "accelerate==1.15.0"],
        "solvers": ["highspy", "pyscipopt"],
    },
    entry_points={"console_scripts": ["monet=monet.cli:main"]},
)
