"""c2jax.rollout.cpu_decode: how a JaxEngine on one CPU device keeps its weights for decode
steps, which read every weight once a step and so are bound by reading them.

    layout = CpuDecodeLayout.choose(cfg, params, num_slots=8, num_draft=0, placement=None)
    laid = layout.to_layout(params)   # per-layer arrays, projection kernels in their forms
    layout.forms                      # {(inputs, outputs): form} stored another way

  layout.py   CpuDecodeLayout (a c2jax.rollout.decode_layout strategy), decode_layout_pays,
              fused_experts_pay: whether the per-layer layout, and fused experts, pay
  forms.py    the projection kernel forms (TRANSPOSED, column pieces, PANELS for
              c2jax_kernels.cpu_matmul), registered with the model's Linear on import;
              relayout stores a per-layer tree's kernels in them
  measure.py  projection_layout: which form of each kernel shape runs fastest at a step's
              rows on this machine, measured once per machine (ProductTimings)
"""

from c2jax.rollout.cpu_decode.forms import PANELS, TRANSPOSED, relayout
from c2jax.rollout.cpu_decode.layout import (CpuDecodeLayout, decode_layout_pays,
                                             fused_experts_pay)
from c2jax.rollout.cpu_decode.measure import ProductTimings, projection_layout

__all__ = ["PANELS", "TRANSPOSED", "CpuDecodeLayout", "ProductTimings", "decode_layout_pays",
           "fused_experts_pay", "projection_layout", "relayout"]
