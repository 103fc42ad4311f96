"""Variance of the k1 / k2 / k3 KL estimators (the report's Figure 4), and why Dr. GRPO
drops the std division.

Panel 1. q = N(0, 1) samples x, p = N(delta, 1); log r = log p(x) - log q(x) =
delta x - delta^2 / 2 and KL(q || p) = delta^2 / 2. Monte-Carlo variance of each
estimator (c2jax.rl.learner.kl) against delta, beside the closed forms
  Var k1 = delta^2,  Var k2 = delta^4 / 2 + delta^6 / 4,  Var k3 = e^(delta^2) - 1 - delta^2:
k3 is the lowest while the policies are close and explodes once they separate; k1 grows
only quadratically (the report's reason to use k1); k2 is also biased. At large delta
the Monte-Carlo k3 variance falls short of the closed form: its mass sits in samples too
rare to appear, which is the same heavy tail seen from the other side.

Panel 2. A group of G rewards, all equal but one that differs by `spread`. The largest
advantage under `grpo` (divided by the group std) stays at unit scale however tiny the
spread (noise is amplified to a full learning signal) until the spread reaches std_eps;
`dr_grpo` scales with the spread.

  python -m experiments.findings.kl_estimators [--samples 200000] [--out PATH]
or, with the numbers as JSON, `python -m experiments.findings.fig4_kl_estimators`.
"""

from __future__ import annotations

import argparse
import pathlib

import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from c2jax.rl.learner import advantages  # pylint: disable=wrong-import-position
from c2jax.rl.learner import kl

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[2] / "docs/figures/kl_estimators.png"


def analytic_variance(delta: np.ndarray) -> dict[str, np.ndarray]:
  d2 = delta * delta
  return {"k1": d2, "k2": d2 * d2 / 2 + d2 * d2 * d2 / 4, "k3": np.expm1(d2) - d2}


def kl_variances(deltas, samples: int, seed: int) -> dict[str, np.ndarray]:
  """{estimator: [mean, variance] per delta}, Monte-Carlo from x ~ N(0, 1)."""
  x = np.random.default_rng(seed).standard_normal(samples).astype(np.float64)
  logq_x = -0.5 * x * x  # the shared -log(sqrt(2 pi)) cancels in log r
  out = {name: np.zeros((len(deltas), 2)) for name in kl.KL_ESTIMATORS}
  for i, delta in enumerate(deltas):
    logp_x = -0.5 * (x - delta) ** 2
    for name in kl.KL_ESTIMATORS:
      values = np.asarray(kl.kl_estimate(name, jnp.asarray(logq_x), jnp.asarray(logp_x)),
                          np.float64)
      out[name][i] = values.mean(), values.var()
  return out


def std_blowup(spreads, group_size: int, std_eps: float) -> dict[str, np.ndarray]:
  """{estimator: max |advantage|} for a group with one reward off by `spread`."""
  rewards_NxG = np.zeros((len(spreads), group_size), np.float32)
  rewards_NxG[:, -1] += spreads
  return {name: np.abs(np.asarray(advantages.compute_advantages(
      name, rewards_NxG, std_eps))).max(-1) for name in ("grpo", "dr_grpo")}


def compute(samples: int, seed: int) -> dict:
  """Every number of the figure: KL estimator moments per delta (Monte-Carlo and closed
  form) and the max |advantage| of a group with one reward off by `spread`."""
  deltas = np.linspace(0.0, 3.0, 13)
  spreads = np.logspace(-8, 0, 17)
  std_eps, group_size = 1e-6, 8
  same = np.ones((1, group_size), np.float32)
  return {"samples": samples, "seed": seed, "deltas": deltas,
          "measured": kl_variances(deltas, samples, seed),
          "closed": analytic_variance(deltas), "spreads": spreads, "std_eps": std_eps,
          "group_size": group_size, "blowup": std_blowup(spreads, group_size, std_eps),
          "identical_grpo_max": float(np.abs(advantages.compute_advantages(
              "grpo", same, std_eps)).max())}


def report(r: dict) -> None:
  deltas, measured, closed = r["deltas"], r["measured"], r["closed"]
  print(f"KL(N(0,1) || N(delta,1)) estimators, {r['samples']} samples per delta")
  print(f"{'delta':>6} {'KL':>7} " + " ".join(
      f"{n + ' mean':>9} {n + ' var':>10} {'(exact)':>10}" for n in kl.KL_ESTIMATORS))
  for i, delta in enumerate(deltas):
    cells = " ".join(f"{measured[n][i, 0]:9.4f} {measured[n][i, 1]:10.4g} "
                     f"{closed[n][i]:10.4g}" for n in kl.KL_ESTIMATORS)
    print(f"{delta:6.2f} {delta * delta / 2:7.4f} {cells}")
  print(f"\nmax |advantage|, group of {r['group_size']} equal rewards but one off by spread "
        f"(std_eps {r['std_eps']:g})")
  print(f"{'spread':>8} {'grpo':>10} {'dr_grpo':>10}")
  for i, spread in enumerate(r["spreads"]):
    print(f"{spread:8.1e} {r['blowup']['grpo'][i]:10.4g} {r['blowup']['dr_grpo'][i]:10.4g}")
  print("identical rewards: grpo max |A| =", r["identical_grpo_max"])


def plot(r: dict):
  deltas, measured, closed = r["deltas"], r["measured"], r["closed"]
  fig, (ax_kl, ax_adv) = plt.subplots(1, 2, figsize=(11, 4.2))
  colours = {"k1": "tab:blue", "k2": "tab:orange", "k3": "tab:red"}
  for name in kl.KL_ESTIMATORS:
    ax_kl.plot(deltas[1:], measured[name][1:, 1], "o", color=colours[name],
               label=f"{name} (Monte-Carlo)")
    ax_kl.plot(deltas[1:], closed[name][1:], "-", color=colours[name], alpha=0.6,
               label=f"{name} (closed form)")
  ax_kl.set_yscale("log")
  ax_kl.set_xlabel("mean separation delta (KL = delta^2 / 2)")
  ax_kl.set_ylabel("per-sample variance")
  ax_kl.set_title("KL(q || p) estimators, q = N(0,1), p = N(delta,1)")
  ax_kl.legend(fontsize=8)
  for name, style in (("grpo", "o-"), ("dr_grpo", "s-")):
    ax_adv.loglog(r["spreads"], r["blowup"][name], style, label=name)
  ax_adv.axvline(r["std_eps"], color="grey", ls=":", label="std_eps")
  ax_adv.set_xlabel("reward spread within the group")
  ax_adv.set_ylabel("max |advantage|")
  ax_adv.set_title(f"std normalisation, group of {r['group_size']}")
  ax_adv.legend(fontsize=8)
  fig.tight_layout()
  return fig


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--samples", type=int, default=200_000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
  args = parser.parse_args()
  results = compute(args.samples, args.seed)
  report(results)
  fig = plot(results)
  args.out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(args.out, dpi=120)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
