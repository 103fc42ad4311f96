"""Meshes and logical-axis rules: the only place that knows how arrays map to devices.

Modules annotate parameters and activations with logical axis names only; a job config's
`parallel` group says the mesh shape and the logical->mesh rules.

Submodules, imported where needed: expert (all-to-all expert parallelism), context
(context parallelism, causal load balance), distributed (multi-process start-up). This
package knows no model, runtime or RL; `c2jax plan`'s modules live in `c2jax.plan`.
"""

from c2jax.parallel.mesh import (MESH_AXES, default_parallel_config, make_mesh,
                                 validate_parallel)
from c2jax.parallel.rules import DEFAULT_RULES, rules_of

__all__ = ["DEFAULT_RULES", "MESH_AXES", "default_parallel_config", "make_mesh",
           "rules_of", "validate_parallel"]
