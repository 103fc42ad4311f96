"""Kernel forms: how a Linear may find its kernel stored, by the param name it holds.

The model stores a kernel one way, 'kernel' [*in_shape, *out_shape] (PLAIN, registered
here). A decode engine may keep its projections another way that multiplies faster on its
platform (the CPU decode layout of c2jax.rollout, for one); it registers each such form
here under its own param name, with the product Linear runs, the shape check Linear
applies and the join back to PLAIN (`register`), when the module that stores the form is
imported, so before anything traces. The model never knows a form but its own: a Linear
whose params hold an unregistered name is an error that names it.

INPUT_AXES names the projections a decode layout may store another way, with how many
leading kernel axes each contracts; `relayout` stores a tree's projection kernels as a
function says and `join` brings every registered form back to PLAIN (model.stack_layers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax

# By module name. MLA's kv_b_proj is left whole (its absorbed decode multiplies by the
# kernel itself), as are routers and experts.
INPUT_AXES = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "q_a_proj": 1,
              "q_b_proj": 1, "kv_a_proj": 1, "gate_proj": 1, "up_proj": 1, "down_proj": 1,
              "lm_head": 1}
PLAIN = "kernel"


class KernelForm(NamedTuple):
  """A way to store a Linear's kernel, under its own param name.

  product(x, stored, in_shape, out_shape, dtype, out_dtype) -> y [..., *out_shape]: x's
    trailing len(in_shape) axes contracted with the kernel in the compute `dtype`,
    accumulated and returned in `out_dtype` when that is set (as with PLAIN).
  problem(stored, in_shape, out_shape) -> what is wrong with `stored` for a Linear of
    these shapes, or None.
  join(stored, n_in) -> the kernel as PLAIN stores it, [*in, *out] (`n_in` input axes).
  """
  product: Callable
  problem: Callable
  join: Callable


def plain_product(x, kernel, in_shape, out_shape, dtype, out_dtype):
  """PLAIN's product: one dot_general over x's trailing len(in_shape) axes."""
  del out_shape
  n_in = len(in_shape)
  contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
  return jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), (contract, ((), ())),
                             preferred_element_type=out_dtype)


# Linear checks PLAIN's shape itself (Flax's param check), so its `problem` finds none.
FORMS: dict[str, KernelForm] = {
    PLAIN: KernelForm(plain_product, lambda *_: None, lambda stored, n_in: stored)}


def _origin(form: KernelForm) -> tuple:
  return tuple((f.__module__, f.__qualname__) for f in form)


def register(param: str, form: KernelForm) -> None:
  """Lets Linear take a kernel stored under `param` as `form` says. The same functions
  registering again (a reloaded module) replace the old ones; other ones are an error."""
  if param in FORMS and _origin(FORMS[param]) != _origin(form):
    raise ValueError(f"kernel form {param!r} is registered already, by "
                     f"{FORMS[param].product.__module__}; give another form another param "
                     "name.")
  FORMS[param] = form


def form_of(module: str, params: Mapping) -> str:
  """The param name of the kernel form a Linear named `module` holds in `params` (PLAIN
  when they are empty, as when the model initialises)."""
  names = sorted(params)
  if not names:
    return PLAIN
  if len(names) == 1 and names[0] in FORMS:
    return names[0]
  raise ValueError(f"{module}: a Linear's params hold {names}; it takes its kernel as "
                   f"exactly one of the registered kernel forms {sorted(FORMS)}. A decode "
                   "layout registers its forms when its module is imported (the CPU one: "
                   "c2jax.rollout.cpu_decode): import it before applying the model to the "
                   "tree it stored.")


def relayout(tree, store: Callable):
  """`tree` with each projection's PLAIN kernel (a dict under an INPUT_AXES name, holding
  'kernel') replaced by store(name, kernel, n_in) -> {param name: stored value}."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    if key in INPUT_AXES and isinstance(value, dict) and hasattr(value.get(PLAIN), "shape"):
      rest = {k: v for k, v in value.items() if k != PLAIN}
      value = {**rest, **store(key, value[PLAIN], INPUT_AXES[key])}
    out[key] = relayout(value, store)
  return out


def join(tree):
  """Inverse of relayout: every projection kernel in a registered form back as PLAIN."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    if key in INPUT_AXES and isinstance(value, dict):
      stored = [name for name in value if name != PLAIN and name in FORMS]
      for name in stored:
        value = {**{k: v for k, v in value.items() if k != name},
                 PLAIN: FORMS[name].join(value[name], INPUT_AXES[key])}
    out[key] = join(value)
  return out


def kernel_shapes(tree, stacked: bool, found: set) -> None:
  """Adds (name, in_shape, out_shape) of each PLAIN projection kernel in `tree` to `found`
  (`stacked`: the kernels carry a leading layer axis, left out)."""
  if not isinstance(tree, dict):
    return
  for key, value in tree.items():
    if key in INPUT_AXES and isinstance(value, dict) and hasattr(value.get(PLAIN), "shape"):
      shape = tuple(value[PLAIN].shape[1:] if stacked else value[PLAIN].shape)
      found.add((key, shape[:INPUT_AXES[key]], shape[INPUT_AXES[key]:]))
    kernel_shapes(value, stacked, found)
