"""Issue 52, config version 3: every shipped config of an older commit, migrated (config.migrate),
equals today's config of that name completed with its opt-in parts (run.complete), field by field.

    git worktree add /tmp/oldtree 08ee987
    python experiments/runner_equivalence/config_v3_compare.py /tmp/oldtree \
        > experiments/runner_equivalence/config_v3_compare.txt
"""

import json
import os
import subprocess
import sys

from textattn import config as config_lib
from textattn import run


def _old(tree: str, code: str) -> str:
  env = {"PYTHONPATH": tree, "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree,
                        env=env, check=True).stdout.strip().splitlines()[-1]


def _flat(node: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in node.items():
    out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else
               {prefix + key: value})
  return out


def main(tree: str) -> int:
  names = _old(tree, "from textattn import config; print(' '.join(config.shipped_configs()))")
  differing = 0
  for name in names.split():
    saved = json.loads(_old(tree, "import json; from textattn import config; "
                                  f"print(json.dumps(config.load({name!r}).to_dict()))"))
    migrated = _flat(config_lib.migrate(saved, run.full_defaults(saved.get("task",
                                                                             "classification"))))
    today = _flat(run.complete(config_lib.load(name)).to_dict())
    bad = {k: (migrated.get(k), today.get(k)) for k in sorted(set(migrated) | set(today))
           if migrated.get(k) != today.get(k)}
    differing += bool(bad)
    print(name, "identical" if not bad else bad)
  print(f"configs differing: {differing} of {len(names.split())}")
  return int(differing > 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
