"""By hand: two-process pretraining with both caches missing, one missing, both hitting; each
must match the one-process run (run from the repository root: python experiments/pretrain_multiprocess_check.py).
Writes under /tmp/mp."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tests.test_train import (
  assert_rows_close,
  cli_args,
  eval_rows,
  free_port,
  run_main,
  write_sentiment_jsonl,
)

t = pathlib.Path("/tmp/mp")
t.mkdir(parents=True, exist_ok=True)
data = write_sentiment_jsonl(t / "r.jsonl", n=240)
over = {"pretrain.objective": "mlm", "pretrain.num_steps": 12, "pretrain.batch_size": 8,
        "pretrain.max_predictions": 4, "pretrain.warmup_steps": 2}
args = cli_args(data, t / "cache0", num_train_steps=20, **over)
one = run_main(args, t / "one"); assert one.returncode == 0, one.stderr[-2000:]
base = eval_rows(t / "one")
def two(name, caches):
  address = f"127.0.0.1:{free_port()}"
  procs = [run_main(cli_args(data, caches[i], num_train_steps=20, **over) + [f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"], t / name, wait=False) for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
  print(name, ["Pretraining the encoder" in o for o in outs], ["read from the" in o for o in outs])
  assert_rows_close(base, eval_rows(t / name))
# (a) both miss, separate caches; (b) process 0 has the cache (cache0 from the one-process run), process 1 misses.
two("miss", [t / "c_a0", t / "c_a1"])
two("half", [t / "cache0", t / "c_b1"])
two("hit", [t / "cache0", t / "c_a1"])
print("ok")
