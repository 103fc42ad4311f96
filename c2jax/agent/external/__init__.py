"""External agent harnesses (mini-swe-agent, any OpenAI-client script) as RL rollouts.

    trajectory = external.run_episode(task, cfg.agent.external, base_url=..., model=...,
                                      capture_path=..., tag="ep-3")

harness (run one episode in a subprocess, grade it), launchers (the HARNESSES registry:
how each harness starts), stitching (captured requests -> Segments by exact token
prefixes), config (agent.external defaults and validation), mini_swe_runner (the
mini-swe-agent side, run by file path).
"""

from c2jax.agent.external.config import default_config, validate
from c2jax.agent.external.harness import run_episode
from c2jax.agent.external.launchers import HARNESSES, Launch
from c2jax.agent.external.stitching import episode_rows, stitch

__all__ = ["HARNESSES", "Launch", "default_config", "episode_rows", "run_episode",
           "stitch", "validate"]
