"""tools/bench/block_scaled.py runs at tiny shapes and times the Hopper path."""

import re

import pytest

from tools.bench import block_scaled


def test_tiny_run_times_hopper_path_beside_portable_and_agrees(capsys):
  block_scaled.main(['--tiny', '--repeats', '1', '--recipes', 'mxfp8',
                     '--paths', 'hopper_fp8,dequantize'])
  out = capsys.readouterr().out
  assert 'M=64 K=96 N=32' in out
  for case in ('bf16', 'mxfp8 [hopper_fp8]', 'mxfp8 [dequantize]'):
    for kind in ('fwd', r'bwd \(2 GEMMs\)'):
      row = re.search(rf'^{re.escape(case)} {kind}\s+([\d.]+)\s', out, re.M)
      assert row and float(row.group(1)) > 0, (case, kind, out)
  agreement = re.search(r'^mxfp8 \[hopper_fp8\]\s+([\d.e+-]+)$', out, re.M)
  assert agreement and float(agreement.group(1)) < 1e-6, out
  with pytest.raises(SystemExit, match='--paths: unknown'):
    block_scaled.main(['--tiny', '--paths', 'wgmma'])
