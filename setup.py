"""c2jax: a JAX/Flax reproduction of the Composer 2 training system."""

from setuptools import find_packages, setup

setup(
    name="c2jax",
    version="0.1.0",
    description="JAX/Flax reproduction of the Composer 2 coding-agent training system",
    python_requires=">=3.12",
    # The repo's top-level kernels/ folder installs as `c2jax_kernels`: a top-level
    # `kernels` would shadow the PyPI `kernels` package that transformers imports when
    # present. In the tree, the c2jax_kernels symlink gives the same name to runs with
    # the checkout on sys.path (`python -m tools.<folder>.<name>` from the root, or
    # PYTHONPATH=.); code imports only `c2jax_kernels`.
    packages=(find_packages(include=["c2jax", "c2jax.*"]) + ["c2jax_kernels"]
              + [f"c2jax_kernels.{p}" for p in find_packages(where="kernels")]),
    package_dir={"c2jax_kernels": "kernels"},
    # cpu_matmul's C++ source, compiled on first use (kernels/cpu_matmul/__init__.py).
    package_data={"c2jax_kernels.cpu_matmul": ["*.cc"]},
    install_requires=[
        # Upper bound: the tested release. The TPU kernels compile through Mosaic, whose
        # serialised module a given libtpu must read (jax 0.12.1 writes Mosaic version 20,
        # libtpu 0.0.50 reads up to 18); move jax, jaxlib, libtpu (tpu-compile) and the
        # CUDA plugin (gpu-compile) together and rerun tests/plan.
        "jax>=0.11.2,<0.12.1",
        "jaxlib>=0.11.2,<0.12.1",
        "flax>=0.12",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "grain>=0.2.12",
        "array-record>=0.8",
        "ml-collections>=1.1",
        "absl-py>=2.1",
        "numpy>=2.0",
        "safetensors>=0.4",
        "tokenizers>=0.21",
        "tiktoken>=0.7",
        "jinja2>=3.1.6",  # sandbox fixes; chat templates from the Hub are untrusted code
        "tensorstore>=0.1.70",
        "tqdm>=4.66",
        "docker>=7.1",
        "PyYAML>=6",
        "tensorboardX>=2.6",
        "ml-dtypes>=0.5",
        "matplotlib>=3.8",
        # c2jax serve (OpenAI-compatible HTTP server) and the OpenAI client (eval harness
        # against endpoints; the client tests use against c2jax serve).
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "openai>=1.40",
        # c2jax serve checks the tools clients send as JSON Schemas.
        "jsonschema>=4.18",
    ],
    extras_require={
        # torch and transformers are deliberately absent: HF reference outputs are
        # committed fixtures (tools/fixtures/make_hf_fixtures.py) and live comparisons run in a
        # separate venv where the CPU torch wheel exists.
        # setuptools: tests/test_install_names.py installs a copy of the project offline.
        # ray: tests/rl/test_ray_backend.py runs the Ray actor backend on a local cluster.
        # mini-swe-agent: the external harness tests/agent/external/test_external_harness.py drives.
        # scipy, nbclient, ipykernel, nbformat: tests/sweep/test_sweep_runs.py
        # executes the notebooks in experiments/notebooks/.
        # wandb: tests/train/test_metrics_wandb.py logs an offline run and reads it back.
        "test": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6.100", "setuptools>=70",
                 "ray>=2.9", "mini-swe-agent>=2.4", "scipy>=1.11", "nbclient>=0.10",
                 "ipykernel>=6.29", "nbformat>=5.9", "wandb>=0.18"],
        # experiments/notebooks/ (scaling-law fits): pip install -e .[notebooks]
        "notebooks": ["scipy>=1.11", "ipykernel>=6.29", "nbclient>=0.10", "nbformat>=5.9"],
        # `c2jax plan --target=v5p-8` and tools/compile/kernels.py: libtpu's TPU
        # compiler, which compiles for compile-only TPU devices on any machine. The version
        # jax pins for its own `tpu` extra (jax 0.12.0.1 -> libtpu 0.0.50.*).
        "tpu-compile": ["libtpu==0.0.50.*"],
        # `c2jax plan --target=h100-8` (h200, b200): XLA's GPU compiler through the CUDA
        # plugin of the same jax release, with ptxas and nvJitLink, compiling for
        # compile-only GPUs on a machine without one. Install it in a virtualenv of its own
        # (tools/setup_gpu_compile.sh): with the plugin present, every JAX process probes
        # for a GPU at start.
        "gpu-compile": ["jax-cuda12-plugin==0.12.0.1", "nvidia-cuda-nvcc-cu12",
                        "nvidia-nvjitlink-cu12"],
        # The OpenXLA kernel library beside c2jax's own kernels (grouped_matmul
        # impl='tokamax', the LM-head loss and attention benchmarks; docs/kernels.md). Its
        # kernels use Mosaic internals of the jax release above: pinned to the tested
        # release, moved together with jax (docs/kernels.md, "Moving the pins").
        "kernels": ["tokamax==0.0.17"],
        # Rollout actors and sweep points as Ray tasks across machines:
        # --config.actors.backend=ray, c2jax sweep --backend=ray.
        "ray": ["ray>=2.9"],
        # Weights & Biases tracking: --config.metrics.loggers="('jsonl','tensorboard','wandb')".
        "wandb": ["wandb>=0.18"],
    },
    entry_points={"console_scripts": ["c2jax=c2jax.cli:run"]},
)
