"""Does `python -m textattn.predict` reproduce a training run's reported test accuracy exactly,
and how fast is it? (issue 26)

    TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.main \
        --config=configs/imdb_keras_fast.py --workdir=runs/keras_fast
    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/predict_check.py runs/keras_fast

Writes IMDB's 25,000 test reviews (TFDS, file order) with their labels to a JSONL file, runs the
predict command on it, and compares its labels with the file's and with the run's test report.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import tensorflow_datasets as tfds


def main(workdir: str) -> None:
  rows = []
  for example in tfds.as_numpy(tfds.load("imdb_reviews", split="test", shuffle_files=False)):
    rows.append({"text": example["text"].decode("utf-8"),
                 "label": ["neg", "pos"][int(example["label"])]})
  with tempfile.TemporaryDirectory() as tmp:
    path, out = os.path.join(tmp, "test.jsonl"), os.path.join(tmp, "predictions.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in rows)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "textattn.predict", f"--workdir={workdir}",
                    f"--input={path}", f"--output={out}"], check=True)
    seconds = time.perf_counter() - start
    with open(out) as f:
      predicted = [json.loads(line)["label"] for line in f]
  accuracy = sum(p == r["label"] for p, r in zip(predicted, rows)) / len(rows)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    report = [json.loads(line) for line in f][-1]
  print(f"{len(rows)} reviews predicted in {seconds:.1f} s ({len(rows) / seconds:,.0f} "
        f"reviews/s, whole command incl. start-up and compilation); accuracy {accuracy:.6f}; "
        f"the run's test report {report['test/accuracy']:.6f} (step "
        f"{report['test/params_from_step']}): "
        + ("identical" if accuracy == report["test/accuracy"] else "DIFFERENT"))


if __name__ == "__main__":
  main(sys.argv[1])
