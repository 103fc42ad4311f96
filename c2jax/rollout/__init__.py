"""c2jax.rollout: the inference engine RL actors and evaluation generate with.

    engine = JaxEngine(cfg, params, num_slots=8, max_length=2048)
    [gen] = engine.generate([Request(prompt_ids, SamplingParams(temperature=1.0, seed=3),
                                     keep_alive=True)])
    gen.tokens, gen.logprobs, gen.versions, gen.expert_indices     # per token
    gen = engine.extend(gen.seq_id, observation_ids)               # next agent turn
    engine.update_params(new_params, version=7)                    # between decode steps

`submit` + `step` drive the engine one decode step at a time (continuous batching);
FakeEngine is a deterministic stand-in for tests. Speculative decoding with the model's
MTP module: JaxEngine(..., num_draft_tokens=D). Across this process's devices, placed by
the training logical rules: JaxEngine(..., parallel=sharding.parse_mesh('fsdp=8')).
"""

from c2jax.rollout.engine import Engine
from c2jax.rollout.fake import FakeEngine
from c2jax.rollout.jax_engine import JaxEngine
from c2jax.rollout.types import FINISH_REASONS, Generation, Request, SamplingParams

__all__ = ["FINISH_REASONS", "Engine", "FakeEngine", "Generation", "JaxEngine", "Request",
           "SamplingParams"]
