"""A/B of the native kernels' vector width (issue 56): 8 floats (AVX2's, forced by
$TEXTATTN_NATIVE_KEY_LANES=8) against 16 (AVX-512F's, the default where the CPU has it) in the
softmax kernel's key direction or the additive kernel's feature chunks (--kernel), forward +
backward, interleaved rounds, each in a fresh process with its own build (cached per width).

  python experiments/cpu_step/key_lanes_ab.py --rounds=3 > experiments/cpu_step/key_lanes_<cpu>.jsonl
  python experiments/cpu_step/key_lanes_ab.py --kernel=additive --rounds=3 \
    > experiments/cpu_step/additive_lanes_<cpu>.jsonl

Shapes [batch, length, heads, head_dim]: the seed model's (32, 200, 2, 16), all-MiniLM-L6-v2's
at 256 tokens (32, 256, 12, 32) and one 1K row (4, 1024, 4, 64). Time it on a quiet machine.
"""

import argparse
import json
import os
import subprocess
import sys

SHAPES = ((32, 200, 2, 16), (32, 256, 12, 32), (4, 1024, 4, 64))

TIMER = """
import json, sys, time, jax, jax.numpy as jnp, numpy as np
from textattn.attention import additive, native, softmax
out = {"key_lanes": native.key_lanes(), "kernel": sys.argv[3]}
for shape in json.loads(sys.argv[1]):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(shape[1])[None, :] < rng.integers(shape[1] // 2, shape[1] + 1,
                                                                  (shape[0], 1)))
  if sys.argv[3] == "softmax":
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(softmax.native_softmax_attention(q, k, v, mask)
                                                 ** 2), argnums=(0, 1, 2)))
  else:  # (v stands in for the second scoring vector's input; w: the "shared" scoring kernels)
    features, heads = shape[2] * shape[3], shape[2]
    w = jnp.asarray(rng.standard_normal((2, features, heads)) * 0.1, jnp.float32)
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(additive.native_additive_attention(
        q, k, mask, w[0], w[1]) ** 2) + 0 * jnp.sum(v), argnums=(0, 1, 2)))
  jax.block_until_ready(f(q, k, v))
  best = float("inf")
  for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); jax.block_until_ready(f(q, k, v)); best = min(best, time.perf_counter() - t)
  out["x".join(map(str, shape))] = round(best * 1e3, 3)
print(json.dumps(out))
"""


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--kernel", choices=("softmax", "additive"), default="softmax")
  parser.add_argument("--repeats", type=int, default=20, help="calls per process; best kept")
  args = parser.parse_args()
  for round_ in range(args.rounds):
    for lanes in ("8", "16"):
      env = dict(os.environ, TEXTATTN_NATIVE_KEY_LANES=lanes)
      result = subprocess.run([sys.executable, "-c", TIMER, json.dumps(SHAPES), str(args.repeats),
                               args.kernel],
                              env=env, capture_output=True, text=True, check=True)
      row = json.loads(result.stdout.strip().splitlines()[-1])
      row.update(round=round_, unit="ms, forward+backward, best of the process's calls")
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
