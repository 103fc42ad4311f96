"""Languages the task builder knows, by name, and which one a checkout is written in.

  language = languages.detect('path/to/checkout')   # LANGUAGES['go'], ...
  records = languages.build_suite('path/to/checkout', 'out/suite.jsonl')

LANGUAGES: 'python' (prepared by `c2jax tasks install`, built by task_builder.py),
'go', 'rust', 'node' (prepared and built here: build.py). base.py says what an entry
answers; mutate.py (one operator or literal of one line) and revert.py (a function's
body replaced by a failing statement) are the edits the non-Python languages share.
"""

from c2jax.env.languages.base import Language
from c2jax.env.languages.build import build_suite, report_path
from c2jax.env.languages.registry import LANGUAGES, detect, get

__all__ = ['LANGUAGES', 'Language', 'build_suite', 'detect', 'get', 'report_path']
