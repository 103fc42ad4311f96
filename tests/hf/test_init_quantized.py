"""init_from a released quantised checkpoint (DeepSeek FP8 blocks, compressed-tensors INT4
experts): the phase inherits the dequantised model config and its parameters equal
hf.load's dequantisation, placed in the run's parameter dtype."""

import jax
import numpy as np
import pytest

from c2jax import hf, model
from c2jax.hf import quant_schemes
from c2jax.train import init_params, jobs, model_source

# The tiny fixture's widths are below INT4's usual group of 32: groups of 16.
_INT4_G16 = quant_schemes.PackedInt(groups=(quant_schemes.IntGroup(("Linear",), 4, 16),))


@pytest.mark.parametrize("scheme", ["fp8", "fp8-ue8m0", _INT4_G16],
                         ids=["fp8", "fp8-ue8m0", "int4-g16"])
def test_init_from_a_quantised_hf_directory(scheme, tmp_path, loaded):
  cfg, params = loaded("deepseek_v3_grouped_yarn")
  hf.save(cfg, params, tmp_path / "released", quantize=scheme)
  source = str(tmp_path / "released")
  model_cfg, where = model_source.source_model(source)
  expected_cfg, expected = hf.load(source)  # the reference: dequantised in memory
  assert "HF model" in where and model_cfg.to_dict() == expected_cfg.to_dict()
  job = jobs.job_defaults("tiny")
  job.model, job.init_from = model_cfg, source
  fresh = jax.eval_shape(lambda: model.init(model_cfg, jax.random.key(0)))
  restored = init_params.restore_init_params(
      job, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), fresh))
  flat_expected = dict(jax.tree_util.tree_leaves_with_path(expected))
  for path, leaf in jax.tree_util.tree_leaves_with_path(restored):
    want = np.asarray(flat_expected[path]).astype(leaf.dtype)
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))
  # ...and those are the quantised weights, not the originals: close, but not equal.
  up = restored["moe_layers"]["moe"]["experts"]["up_proj"]
  original = np.asarray(params["moe_layers"]["moe"]["experts"]["up_proj"], np.float32)
  assert not np.array_equal(np.asarray(up, np.float32), original)
  assert np.abs(np.asarray(up, np.float32) - original).max() <= np.abs(original).max() / 8
