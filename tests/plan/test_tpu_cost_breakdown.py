"""tools/compile/tpu_cost_breakdown.py: the TPU compiler's per-instruction cycle estimates,
added up by the JAX operation they came from."""

import numpy as np
import pytest

from c2jax.plan import topologies
from tools.compile import tpu_cost_breakdown


HLO = """\
%fused_computation.1 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %add.9 = f32[8]{0} add(%param_0, %param_0), backend_config={"estimated_cycles":"999"}
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %fusion.1 = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(Transformer)/moe/experts/dot_general"}, backend_config={"estimated_cycles":"300"}
  %fusion.2 = f32[8]{0} fusion(%fusion.1), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/transpose(jvp(Transformer))/moe/experts/dot_general"}, backend_config={"estimated_cycles":"100"}
  %scatter.3 = f32[8]{0} scatter(%fusion.2), metadata={op_name="jit(train_step)/jvp(Transformer)/moe/scatter-add"}, backend_config={"estimated_cycles":"9223372036854775807"}
  ROOT %copy.4 = f32[8]{0} copy(%scatter.3), backend_config={"estimated_cycles":"50"}
}
"""


def test_adds_estimates_by_operation_and_keeps_uncosted_apart():
  result = tpu_cost_breakdown.breakdown(HLO)
  # The fusion body's own estimate is inside its fusion's: not counted twice.
  assert result.cycles == {"fwd moe/experts/dot_general": 300,
                           "bwd moe/experts/dot_general": 100, "? copy": 50}
  assert result.total == 450
  assert result.unknown == {"fwd moe/scatter-add": 1}
  assert result.by_opcode == {"fusion": 400, "copy": 50}
  text = tpu_cost_breakdown.format_breakdown(result, top=2)
  assert "66.7%" in text and "fwd moe/experts/dot_general" in text
  assert "no estimate (not summed): fwd moe/scatter-add x1" in text


def test_a_step_compiled_for_a_tpu_names_its_matmul_first(monkeypatch):
  pytest.importorskip("libtpu")
  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another test process may hold it
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  mesh = Mesh(np.array(topologies.parse_target("v5p-8").devices()[:1]), ("x",))
  spec = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16,
                              sharding=NamedSharding(mesh, PartitionSpec()))
  hlo = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(spec, spec).compile().as_text()
  result = tpu_cost_breakdown.breakdown(hlo)
  assert result.total > 0
  assert "dot_general" in result.cycles.most_common(1)[0][0]
