"""Checks tool arguments against a tool's JSON schema (the subset tools use).

Schemas are objects whose properties have type string | integer | boolean | number.
strict=True rejects unknown arguments and wrong types; strict=False drops unknown
arguments and converts obvious scalars ("12" -> 12, "true" -> True, 3 -> "3").
"""

import math

_PY_TYPES = {'string': str, 'integer': int, 'boolean': bool, 'number': (int, float)}


class ArgumentError(ValueError):
  """Arguments that do not fit the schema; the message is shown to the model."""


def _coerce(value, kind):
  if kind == 'integer' and isinstance(value, str) and value.strip().lstrip('-').isdigit():
    return int(value)
  if kind == 'integer' and isinstance(value, float) and value.is_integer():
    return int(value)
  if kind == 'boolean' and isinstance(value, str) and value.lower() in ('true', 'false'):
    return value.lower() == 'true'
  if kind == 'string' and isinstance(value, (int, float)) and not isinstance(value, bool):
    return str(value)
  return value


def _fits(value, kind) -> bool:
  if isinstance(value, bool) and kind != 'boolean':
    return False  # bool is an int in Python, never in JSON
  if isinstance(value, float) and not math.isfinite(value):
    return False  # NaN / inf would break timeouts and limits
  return isinstance(value, _PY_TYPES[kind])


def validate(tool: str, arguments: dict, schema: dict, strict: bool) -> dict:
  """Returns the arguments with defaults filled in, or raises ArgumentError."""
  properties = schema.get('properties', {})
  unknown = sorted(set(arguments) - set(properties))
  if unknown and strict:
    raise ArgumentError(f'{tool} got unknown argument(s) {unknown}; it accepts '
                        f'{sorted(properties)}.')
  clean = {}
  for name, spec in properties.items():
    if name not in arguments:
      if name in schema.get('required', ()):
        raise ArgumentError(f'{tool} is missing the required argument "{name}" '
                            f'({spec["type"]}: {spec.get("description", "")}).')
      if 'default' in spec:
        clean[name] = spec['default']
      continue
    value = arguments[name]
    if not strict:
      value = _coerce(value, spec['type'])
    if not _fits(value, spec['type']):
      raise ArgumentError(f'{tool}: argument "{name}" must be a {spec["type"]}, not '
                          f'{type(value).__name__} {str(value)[:40]!r}.')
    if 'minimum' in spec and value < spec['minimum']:
      raise ArgumentError(f'{tool}: argument "{name}" must be >= {spec["minimum"]}, '
                          f'got {value}.')
    clean[name] = value
  return clean
