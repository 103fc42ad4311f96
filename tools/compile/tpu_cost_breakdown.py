"""Where the TPU compiler's time estimate of a train step goes, by source operation.

The TPU compiler writes its own cycle estimate into the backend config of most
instructions of the optimised HLO ("estimated_cycles"); this adds them up by the JAX
operation each instruction came from (its op_name: module path and primitive, forward or
backward), so a step that the cost model calls slow can be read op by op. Instructions
the compiler could not cost carry a sentinel instead of a number (scatters and some
gathers): they are counted and listed apart, not summed. Pallas kernels and collectives
carry no estimate here (the cost analysis models them separately), so the sum is a lower
bound of `optimal_seconds`; the table's shares are of the costed instructions.

  python -m tools.compile.tpu_cost_breakdown --target=v5p-8     # `small`, as
      # vs_maxtext.py compiles it (bf16, fp32 params, remat full, pallas, unrolled)
  python -m tools.compile.tpu_cost_breakdown --target=v5p-8 \\
      --set model.moe_impl=ragged --top 40
  python -m tools.compile.tpu_cost_breakdown --hlo saved_step.txt   # any HLO

Needs libtpu (pip install -e ".[tpu-compile]"); every figure is a compiler estimate.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
UNKNOWN = 10 ** 15  # the compiler's "no estimate" sentinel is ~2^63
# op_name components that say how an op was reached, not what it is.
_WRAPPERS = ('jit(train_step', 'transpose(', 'jvp(', 'eval_jaxpr', 'checkpoint',
             'rematted', 'closed_call', 'pjit', 'remat', 'vmap(')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z\-]+)\(')
_FUSION_BODY = re.compile(r'kind=k\w+, calls=%?([\w.\-]+)')


@dataclasses.dataclass
class Breakdown:
  cycles: collections.Counter      # op key -> estimated cycles
  count: collections.Counter       # op key -> instructions
  unknown: collections.Counter     # op key -> instructions with no estimate
  by_opcode: collections.Counter   # HLO opcode -> estimated cycles

  @property
  def total(self) -> int:
    return sum(self.cycles.values())


def op_key(line: str, opcode: str) -> str:
  """'fwd moe/experts/shard_map/dot_general' style: direction and the last four
  meaningful op_name components; '? <opcode>' where the instruction has no op_name."""
  found = re.search(r'op_name="([^"]+)"', line)
  if not found:
    return f'? {opcode}'
  name = found.group(1)
  parts = [p for p in name.split('/') if p and not p.startswith(_WRAPPERS)]
  return ('bwd ' if 'transpose(' in name else 'fwd ') + '/'.join(parts[-4:])


def breakdown(hlo_text: str) -> Breakdown:
  """Estimated cycles of every instruction outside fusion bodies (a fusion carries the
  estimate of its whole body), by op key."""
  bodies = set(_FUSION_BODY.findall(hlo_text))
  result = Breakdown(collections.Counter(), collections.Counter(), collections.Counter(),
                     collections.Counter())
  computation = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and not line.startswith(' '):
      computation = header.group(1)
      continue
    if computation in bodies:
      continue
    estimate = re.search(r'"estimated_cycles":"(\d+)"', line)
    instruction = _INSTRUCTION.match(line)
    if not estimate or not instruction:
      continue
    opcode = instruction.group(1)
    key = op_key(line, opcode)
    cycles = int(estimate.group(1))
    if cycles >= UNKNOWN:
      result.unknown[key] += 1
      continue
    result.cycles[key] += cycles
    result.count[key] += 1
    result.by_opcode[opcode] += cycles
  return result


def format_breakdown(result: Breakdown, top: int) -> str:
  total = max(result.total, 1)
  lines = [f"estimated cycles of the costed instructions: {result.total:,}",
           f"{'share':>6} {'cycles':>12} {'instrs':>6}  operation"]
  for key, cycles in result.cycles.most_common(top):
    lines.append(f"{cycles / total:>6.1%} {cycles:>12,} {result.count[key]:>6}  {key}")
  lines.append("by HLO opcode: " + ", ".join(
      f"{op} {cycles / total:.1%}" for op, cycles in result.by_opcode.most_common(6)))
  if result.unknown:
    lines.append("no estimate (not summed): " + ", ".join(
        f"{key} x{n}" for key, n in result.unknown.most_common(8)))
  return "\n".join(lines)


def compile_small(target: str, settings: list[str]):
  """c2jax's `small` train step as vs_maxtext.py compiles it (global batch 32 x
  256), then `settings` ('model.moe_impl=ragged'), for `target`'s compile-only devices."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # see commands/plan_target.py
  from c2jax import config as configlib
  from c2jax.plan import memory as memory_lib
  from c2jax.plan import topologies
  from tools.compile.vs_maxtext import c2jax_settings

  cfg = configlib.load_config_file(REPO / "configs" / "pretrain.py", "small")
  for setting in [*c2jax_settings(32, 256), *settings]:
    # 'model.moe_impl=ragged' -> {'model': {'moe_impl': 'ragged'}}
    key, value = _parse_setting(setting)
    for part in reversed(key.split(".")):
      value = {part: value}
    configlib.apply_overrides(cfg, value)
  devices = topologies.parse_target(target).devices()
  compiled = memory_lib.compile_train_step(cfg, devices)[0]
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return compiled.as_text(), cost


def _parse_setting(text: str):
  if "=" not in text:
    raise SystemExit(f"--set {text!r}: expected key=value, e.g. model.moe_impl=ragged")
  key, value = text.split("=", 1)
  for cast in (int, float):
    try:
      return key, cast(value)
    except ValueError:
      pass
  return key, value


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--target", default="v5p-8", help="a TPU slice, e.g. v5p-8")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override on top of `small` (repeatable)")
  parser.add_argument("--hlo", default="", help="read this optimised HLO text instead")
  parser.add_argument("--save_hlo", default="", help="write the compiled HLO text here")
  parser.add_argument("--top", type=int, default=25)
  args = parser.parse_args(argv)
  if args.hlo:
    text = pathlib.Path(args.hlo).read_text()
  else:
    text, cost = compile_small(args.target, args.set)
    print(f"{args.target}, `small` train step ({', '.join(args.set) or 'defaults'}): "
          f"{cost.get('flops', 0):.4g} FLOPs, {cost.get('bytes accessed', 0):.4g} bytes "
          f"accessed, compiler's time estimate {cost.get('optimal_seconds', 0) * 1e3:.2f} ms "
          "(TPU compiler estimates)")
    if args.save_hlo:
      pathlib.Path(args.save_hlo).write_text(text)
  print(format_breakdown(breakdown(text), args.top))


if __name__ == "__main__":
  main()
