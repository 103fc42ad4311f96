"""Quantised training: the same pretraining run under several `model.quant` recipes.

Runs the real trainer (`c2jax pretrain`) once per recipe with identical config, seed and
data order, so the runs differ only in how the MoE expert matmuls are computed, then
prints the loss curves side by side: eval loss at every eval step, the final eval loss,
the mean train loss over the last `--tail` steps, their gap relative to the first recipe
(the baseline, normally 'none' = float32), and throughput (tokens per median step time,
which ignores the compile and eval/checkpoint pauses) relative to the baseline.

  python -m experiments.findings.quant_training --steps 300 --moe_impl ragged \
      --quants none,mxfp8 --root runs/quant_training
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_pretrain(workdir, *, config, steps, moe_impl, quant, cache_dir):
  """One fresh `c2jax pretrain` run in a subprocess; returns its metrics.jsonl rows."""
  shutil.rmtree(workdir, ignore_errors=True)
  command = [sys.executable, '-m', 'c2jax.cli', 'pretrain', f'--config={config}',
             f'--workdir={workdir}', f'--config.train.steps={steps}',
             f'--config.model.moe_impl={moe_impl}', f'--config.model.quant={quant}']
  if cache_dir:
    command.append(f'--config.data.cache_dir={cache_dir}')
  print(f"[{quant}] {' '.join(command[1:])}", flush=True)
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  if result.returncode != 0:
    raise SystemExit(f"pretrain with quant={quant!r} failed (exit {result.returncode}); "
                     f"last output:\n{result.stderr[-3000:]}")
  with open(pathlib.Path(workdir) / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def summarise(rows, tail):
  """Loss curve and throughput of one run's metric rows."""
  train = {r['step']: r for r in rows if 'loss' in r}
  evals = {r['step']: r['eval_loss'] for r in rows if 'eval_loss' in r}
  if not train or not evals:
    raise SystemExit("metrics.jsonl has no train or eval rows; is train.eval_every > 0?")
  steps = sorted(train)
  # Step times between consecutive logged steps; the median skips compiles and evals.
  step_s = [train[b]['time'] - train[a]['time'] for a, b in zip(steps, steps[1:]) if b == a + 1]
  tokens = statistics.median(train[s]['tokens'] for s in steps)
  return dict(
      evals=evals,
      final_eval=evals[max(evals)],
      tail_train=statistics.fmean(train[s]['loss'] for s in steps[-tail:]),
      tokens_per_s=tokens / statistics.median(step_s) if step_s else float('nan'))


def print_report(summaries, args):
  names = list(summaries)
  base = summaries[names[0]]
  print(f"\nquantised training, {datetime.date.today()}, {platform.node()} "
        f"({os.cpu_count()} CPUs), {args.config}, {args.steps} steps, "
        f"moe_impl={args.moe_impl}; gaps relative to quant={names[0]!r}\n")
  header = f"{'eval step':>9} " + ' '.join(f'{n:>22}' for n in names)
  print(header)
  for step in sorted(base['evals']):
    cells = []
    for name in names:
      loss = summaries[name]['evals'].get(step, float('nan'))
      gap = (loss - base['evals'][step]) / base['evals'][step]
      cells.append(f'{loss:>12.4f} ({gap:+8.3%})')
    print(f'{step:>9} ' + ' '.join(cells))
  print(f"\n{'quant':<22}{'final eval loss':>16}{'rel. gap':>10}"
        f"{f'train loss (last {args.tail})':>26}{'rel. gap':>10}{'tokens/s':>10}"
        f"{'vs base':>9}")
  for name in names:
    s = summaries[name]
    print(f"{name:<22}{s['final_eval']:>16.4f}"
          f"{(s['final_eval'] - base['final_eval']) / base['final_eval']:>+10.3%}"
          f"{s['tail_train']:>26.4f}"
          f"{(s['tail_train'] - base['tail_train']) / base['tail_train']:>+10.3%}"
          f"{s['tokens_per_s']:>10.0f}{s['tokens_per_s'] / base['tokens_per_s']:>9.2f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='configs/pretrain.py:tiny')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--moe_impl', default='ragged')
  parser.add_argument('--quants', default='none,mxfp8',
                      help='comma-separated recipes; the first is the baseline')
  parser.add_argument('--cache_dir', default=None, help='data.cache_dir (corpus cache)')
  parser.add_argument('--root', default='runs/quant_training', help='workdirs go here')
  parser.add_argument('--tail', type=int, default=20, help='train steps averaged at the end')
  args = parser.parse_args()
  summaries = {}
  for quant in args.quants.split(','):
    rows = run_pretrain(pathlib.Path(args.root) / quant, config=args.config,
                        steps=args.steps, moe_impl=args.moe_impl, quant=quant,
                        cache_dir=args.cache_dir)
    summaries[quant] = summarise(rows, args.tail)
  print_report(summaries, args)


if __name__ == '__main__':
  main()
