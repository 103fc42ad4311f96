"""Communication volume per device, read from a compiled program's HLO text.

    volumes = comm_volume(compiled.as_text())     # {op kind: CommVolume}
    print(format_comm_table(volumes))

Every collective instruction (all-gather, reduce-scatter, all-reduce, all-to-all,
ragged-all-to-all, collective-permute, and their async -start forms) is counted with the number of times it
runs per step: an instruction inside a while body (the scan over layers) counts its
loop's trip count (XLA's `known_trip_count`, or where the compiler wrote none, as libtpu
does for the SPMD partitioner's windowed einsums, the count of a loop of the form
`for i = a; i < N; i += s` read from its condition and body), nested loops multiply;
every branch of a conditional counts as taken (an upper bound). The compiled text
names operands without shapes, so shapes are looked up from their defining instructions.
libtpu writes a reduce-scatter as a fusion named `all-reduce-scatter*` around an
all-reduce and the dynamic slice of this device's part; such an all-reduce is counted as
the reduce-scatter it runs as.

Two byte counts per device:
  operand bytes  what the device passes in (its shard for an all-gather, its full
                 summand for an all-reduce or reduce-scatter)
  wire bytes     what a bandwidth-optimal ring sends per device for a group of n:
                 all-gather (n-1)/n * result, reduce-scatter and all-to-all
                 (n-1)/n * operand, all-reduce 2 (n-1)/n * operand,
                 collective-permute the operand
A ragged-all-to-all's operands are its send buffer, the buffer it receives into and four
offset arrays; only the send buffer (and the offsets) leave the device, and how many of
its rows do is decided at run time, so both counts are upper bounds: operand bytes
exclude the receive buffer, wire bytes are (n-1)/n of the send buffer.
"""

from __future__ import annotations

import dataclasses
import math
import re

from c2jax.plan.memory import GB, format_table

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "ragged-all-to-all",
         "collective-permute")

_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
         "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
         "c64": 64, "c128": 128}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s*\(")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([^\s=]+)\s*=\s*")
_CALLEE = re.compile(r"\b(?:body|condition|calls|to_apply|true_computation|"
                     r"false_computation)=%?([^\s,}]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
# The computation libtpu fuses a reduce-scatter into (an all-reduce, then a dynamic slice).
_REDUCE_SCATTER_FUSION = "all-reduce-scatter"


def dtype_bits(name: str) -> int:
  if name in _BITS:
    return _BITS[name]
  if name.startswith(("f8", "s8", "u8")):
    return 8
  if name.startswith(("f4", "s4", "u4")):
    return 4
  raise ValueError(f"unknown HLO element type {name!r} in a collective's shape; add its "
                   "width to c2jax.plan.hlo_comms._BITS.")


def shape_bytes(type_text: str) -> int:
  """Bytes of an HLO type: an array `bf16[8,128]{1,0}` or a tuple of them."""
  bits = 0
  for dtype, dims in _ARRAY.findall(type_text):
    if dtype == "token":
      continue
    bits += dtype_bits(dtype) * math.prod(int(d) for d in dims.split(",") if d)
  return bits // 8


def _split_paren(text: str) -> tuple[str, str]:
  """('(...)' balanced prefix of text starting at '(', the rest)."""
  depth = 0
  for i, char in enumerate(text):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      return text[:i + 1], text[i + 1:]
  raise ValueError(f"unbalanced parentheses in HLO: {text[:200]!r}")


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  type_text: str
  opcode: str
  operands: tuple[str, ...]
  attributes: str
  args: str = ""  # the operand list as written (a constant's literal)


def _parse_instruction(line: str) -> Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  rest = line[match.end():]
  if rest.startswith("("):
    type_text, rest = _split_paren(rest)
  else:
    type_text, _, rest = rest.partition(" ")
  rest = rest.lstrip()
  opcode_match = re.match(r"([a-z][a-z0-9\-]*)\(", rest)
  if not opcode_match:
    return None
  args, attributes = _split_paren(rest[opcode_match.end() - 1:])
  operands = tuple(re.findall(r"%([^\s,()]+)", args))
  return Instruction(match.group(1), type_text, opcode_match.group(1), operands, attributes,
                     args[1:-1])


def parse_module(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """({computation name: instructions}, entry computation name) of an HLO module's text."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    if not line.strip() or line.startswith(("HloModule", "}")):
      continue
    if not line[0].isspace():
      match = _COMPUTATION.match(line)
      if match:
        current = match.group(1)
        computations[current] = []
        if line.startswith("ENTRY"):
          entry = current
      continue
    instruction = _parse_instruction(line) if current else None
    if instruction:
      computations[current].append(instruction)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text; pass compiled.as_text() of a "
                     "jax.stages.Compiled (or lowered.as_text(dialect='hlo')).")
  return computations, entry


def _add(a: int | None, b: int | None) -> int | None:
  return None if a is None or b is None else a + b


def _through_copies(name: str, defs: dict[str, Instruction],
                    ops=("copy", "bitcast")) -> Instruction | None:
  """The instruction that defines `name`, past copies (libtpu copies loop counters)."""
  ins = defs.get(name)
  while ins is not None and ins.opcode in ops and ins.operands:
    ins = defs.get(ins.operands[0])
  return ins


def _constant(name: str, defs: dict[str, Instruction]) -> int | None:
  ins = _through_copies(name, defs, ("copy", "convert", "bitcast"))
  if ins is None or ins.opcode != "constant" or not re.fullmatch(r"-?\d+", ins.args.strip()):
    return None
  return int(ins.args)


def _param_index(name: str, defs: dict[str, Instruction]) -> int | None:
  """k where `name` is get-tuple-element(parameter, index=k): a loop-carried value."""
  ins = _through_copies(name, defs)
  if ins is None or ins.opcode != "get-tuple-element" or not ins.operands:
    return None
  source, found = defs.get(ins.operands[0]), re.search(r"\bindex=(\d+)", ins.attributes)
  return int(found.group(1)) if found and source and source.opcode == "parameter" else None


def counted_loop_trips(loop: Instruction, computations: dict[str, list[Instruction]],
                       defs: dict[str, Instruction]) -> int | None:
  """Trips of a while loop that XLA did not annotate with `known_trip_count` (libtpu's
  compiled HLO carries none, e.g. for the SPMD partitioner's windowed einsums), when it
  has the counted form: condition `i < N` (or `<=`, or reversed) on a tuple element that
  starts at a constant and that the body steps by a positive constant. None otherwise."""
  cond = re.search(r"\bcondition=%?([^\s,}]+)", loop.attributes)
  body = re.search(r"\bbody=%?([^\s,}]+)", loop.attributes)
  if not (cond and body and computations.get(cond.group(1)) and
          computations.get(body.group(1)) and loop.operands):
    return None
  compare = computations[cond.group(1)][-1]
  direction = re.search(r"direction=(\w+)", compare.attributes)
  if compare.opcode != "compare" or not direction or len(compare.operands) != 2:
    return None
  lhs, rhs = compare.operands
  flip = {"GT": "LT", "GE": "LE"}
  if _param_index(lhs, defs) is not None:
    index, bound, op = _param_index(lhs, defs), _constant(rhs, defs), direction.group(1)
  else:
    index, bound = _param_index(rhs, defs), _constant(lhs, defs)
    op = flip.get(direction.group(1), "")
  root, init = computations[body.group(1)][-1], defs.get(loop.operands[0])
  if index is None or bound is None or op not in ("LT", "LE") or root.opcode != "tuple" or (
      init is None or init.opcode != "tuple" or index >= len(init.operands)):
    return None
  start, step = _constant(init.operands[index], defs), defs.get(root.operands[index])
  if start is None or step is None or step.opcode != "add" or len(step.operands) != 2:
    return None
  counter, increment = step.operands
  if _param_index(counter, defs) != index:
    counter, increment = increment, counter
  increment = _constant(increment, defs)
  if _param_index(counter, defs) != index or not increment or increment < 0:
    return None
  return max(0, -(-(bound - start + (op == "LE")) // increment))


def executions(computations: dict[str, list[Instruction]], entry: str) -> dict[str, int | None]:
  """How many times each computation runs per call of `entry` (while bodies x trips).

  None where a data-dependent loop (no known trip count, e.g. a Pallas kernel's grid
  run in interpret mode) encloses the computation: fine unless it holds a collective.
  XLA prints computations callees first, so callers are visited before their callees.
  """
  counts: dict[str, int | None] = {name: 0 for name in computations}
  counts[entry] = 1
  defs = {ins.name: ins for body in computations.values() for ins in body}
  for name in reversed(list(computations)):
    for instruction in computations[name]:
      callees = _CALLEE.findall(instruction.attributes)
      for branches in _BRANCHES.findall(instruction.attributes):
        callees += [b.strip().lstrip("%") for b in branches.split(",") if b.strip()]
      trips = 1
      if instruction.opcode == "while":
        found = _TRIP_COUNT.search(instruction.attributes)
        trips = int(found.group(1)) if found else counted_loop_trips(
            instruction, computations, defs)
      runs = None if trips is None or counts[name] is None else counts[name] * trips
      for callee in callees:
        if callee in counts:
          counts[callee] = _add(counts[callee], runs)
  return counts


def group_size(attributes: str, num_devices: int | None) -> int:
  """Participants per replica group, from any of XLA's three replica_groups spellings."""
  mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
  if mesh_form:
    sizes = {name: int(size) for name, size in
             re.findall(r"'([^']+)'=(\d+)", mesh_form.group(1))}
    return math.prod(sizes[name] for name in re.findall(r"'([^']+)'", mesh_form.group(2)))
  iota_form = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
  if iota_form:
    return int(iota_form.group(2))
  listed = re.search(r"replica_groups=\{(\{[^}]*\})", attributes)
  if listed:
    return len([d for d in listed.group(1).strip("{}").split(",") if d.strip()])
  if num_devices is None:
    raise ValueError("a collective spans all devices (empty replica_groups); pass "
                     "num_devices to size its group.")
  return num_devices


@dataclasses.dataclass
class CommVolume:
  ops: int = 0            # instructions in the program text
  executions: int = 0     # times they run per step
  operand_bytes: int = 0  # per device, per step
  wire_bytes: float = 0.0  # per device, per step (ring estimate)


def _wire_bytes(kind: str, operand: int, result: int, n: int) -> float:
  share = (n - 1) / n if n > 1 else 0.0
  return {"all-gather": result * share, "reduce-scatter": operand * share,
          "all-to-all": operand * share, "ragged-all-to-all": operand * share,
          "all-reduce": 2 * operand * share,
          "collective-permute": float(operand)}[kind]


def comm_volume(hlo_text: str, num_devices: int | None = None) -> dict[str, CommVolume]:
  """Per-device communication per step by collective kind (KINDS order, zeros included)."""
  computations, entry = parse_module(hlo_text)
  runs = executions(computations, entry)
  types = {ins.name: ins.type_text for body in computations.values() for ins in body}
  volumes = {kind: CommVolume() for kind in KINDS}
  for name, body in computations.items():
    for ins in body:
      kind = ins.opcode.removesuffix("-start")
      if kind not in volumes or ins.opcode.endswith("-done") or runs[name] == 0:
        continue
      if kind == "all-reduce" and name.startswith(_REDUCE_SCATTER_FUSION):
        kind = "reduce-scatter"
      sent = [o for i, o in enumerate(ins.operands) if kind != "ragged-all-to-all" or i != 1]
      operand = sum(shape_bytes(types[o]) for o in sent if o in types)
      if ins.opcode.endswith("-start") and kind != "collective-permute":
        # Async starts return (operands, results[, scratch]): the results follow.
        result = _async_result_bytes(ins.type_text, len(ins.operands))
      else:
        result = shape_bytes(ins.type_text)
      count = runs[name]
      if count is None:
        raise ValueError(
            f"collective {ins.name} runs inside a while loop with no known trip count, so "
            "its volume per step is unknown; scan over a static length (nn.scan does).")
      volume = volumes[kind]
      volume.ops += 1
      volume.executions += count
      volume.operand_bytes += count * operand
      # A permute sends its operand to one peer whatever the pairs: no group to size.
      group = 2 if kind == "collective-permute" else group_size(ins.attributes, num_devices)
      volume.wire_bytes += count * _wire_bytes(kind, operand, result, group)
  return volumes


def _async_result_bytes(type_text: str, num_operands: int) -> int:
  arrays = _ARRAY.findall(type_text)
  results = arrays[num_operands:2 * num_operands] if len(arrays) > num_operands else arrays
  return sum(dtype_bits(dtype) * math.prod(int(d) for d in dims.split(",") if d) // 8
             for dtype, dims in results)


def format_comm_table(volumes: dict[str, CommVolume]) -> str:

  rows = [("collective (per device, per step)", "ops", "runs", "operand GB", "wire GB")]
  for kind, v in volumes.items():
    rows.append((kind, str(v.ops), str(v.executions), f"{v.operand_bytes / GB:,.3f}",
                 f"{v.wire_bytes / GB:,.3f}"))
  rows.append(("total", str(sum(v.ops for v in volumes.values())),
               str(sum(v.executions for v in volumes.values())),
               f"{sum(v.operand_bytes for v in volumes.values()) / GB:,.3f}",
               f"{sum(v.wire_bytes for v in volumes.values()) / GB:,.3f}"))
  return format_table(rows)


def summary(volumes: dict[str, CommVolume]) -> dict:
  return {kind: dataclasses.asdict(v) for kind, v in volumes.items()}
