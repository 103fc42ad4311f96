"""Evaluation harness: suites, policies, a resumable runner, metrics and reports.

  c2jax eval --config=configs/eval.py:<suite> --workdir=DIR     (c2jax/commands/eval.py -> runner.run)
  c2jax eval report DIR [DIR...] --out=OUT                      (report.py)

  suites.register_suite   agent suites (build Tasks) and scored suites (yield records)
  policies.POLICIES       oracle | engine | openai
  runner.evaluate_tasks   any task list with any policy into a run dir (RL uses it)
  metrics.pass_at_k       unbiased pass@k; metrics.summarize the tables
"""
