"""Default configuration: every field any textattn run reads, with its default.

Other configs start from this one and change a field or two. Run any config with
    python -m textattn.main --config=configs/<name>.py --workdir=DIR [--config.<field>=<value>]
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  # ---- Data -----------------------------------------------------------------
  # A TFDS name ("imdb_reviews") or the path of a local .csv / .tsv / .jsonl file.
  config.dataset = "imdb_reviews"
  # TFDS data dir. "" means: $TFDS_DATA_DIR if set, else TFDS's default (~/tensorflow_datasets).
  config.data_dir = ""
  # Local files only: comma-separated text field(s) (joined with a space) and the label field.
  config.text_fields = "text"
  config.label_field = "label"
  # Fraction of the training split held out (deterministically, from data_seed) as validation.
  config.val_fraction = 0.1
  # Split evaluated during training: "validation" (carved from train) or "test".
  config.eval_split = "validation"
  config.data_seed = 0
  # Tokenizer: "word" (Keras TextVectorization-style standardisation, top-vocab_size words
  # counted on the training split only; id 0 = padding, 1 = out-of-vocabulary) or "byte".
  config.tokenizer = "word"
  config.vocab_size = 20000
  # Word tokenizer: "strip" deletes ASCII punctuation (Keras' default, as the seeds), "split"
  # keeps each mark as a token of its own ("7/10!" -> "7 / 10 !").
  config.punctuation = "strip"
  config.max_len = 200
  # "pre" drops tokens from the start (keeps the end of a review; Keras pad_sequences default),
  # "post" drops tokens from the end.
  config.truncation = "pre"
  # "after_masked": tokens first, padding after, masked out of attention and pooling.
  # "before_as_token": the Keras seed's computation: padding before the tokens (pad_sequences)
  # and never masked, so id 0 is embedded, attended to and averaged like a token (mean pooling
  # then also sees the review's length). Not with pretraining.
  config.padding = "after_masked"
  # Where tokenised arrays are cached between runs. "" means ~/.cache/textattn.
  config.cache_dir = ""

  # ---- Model ----------------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  config.model.attention = "softmax"  # softmax | causal | additive
  # Softmax/causal kernel: xla (reference einsum) | dot_product (jax.nn.dot_product_attention's
  # default, the XLA path) | cudnn (its cuDNN flash attention: GPU + bfloat16 only;
  # experimental, never run yet) | chunked
  # (memory-efficient, exact) | fused (exact, hand-written backward, XLA) | native (exact, C++
  # XLA FFI kernel compiled on first use; CPU and one device only, the fastest there) | auto
  # (native on a one-device CPU run where it builds, else fused). Additive attention has two:
  # native (its own C++ kernel; head_dim a multiple of 8) and the XLA function (every other
  # name); auto picks it where the softmax one would and head_dim is a multiple of 8.
  config.model.attention_impl = "auto"
  config.model.additive_scoring = "shared"  # shared (authors' code) | per_head (paper)
  config.model.embed_dim = 32
  config.model.num_heads = 2
  config.model.num_layers = 1
  config.model.ffn_dim = 32
  config.model.mlp_dim = 20  # hidden dense units in the head; 0 = none
  config.model.dropout_rate = 0.1  # after attention, FFN, pooling and the head's hidden layer
  config.model.embed_dropout_rate = 0.0  # on the token + position embeddings (off in the seeds)
  # Word dropout: each token's embedding zeroed with this probability in training (not
  # rescaled; its position embedding and its place in the mask stay). Off in the seeds.
  config.model.token_dropout_rate = 0.0
  # > 0: add a hashed embedding of each (previous token, token) pair, this many rows, zero at
  # the start (fastText's bigram features inside the encoder). 0 = off.
  config.model.bigram_buckets = 0
  # Dropout mask bits: "hash" (counter-based integer hash keyed by threefry; fast on CPU) or
  # "threefry" (jax.random.bits). Both are sharding-invariant; see textattn/models.py.
  config.model.dropout_rng = "hash"
  config.model.position = "learned"  # learned | sinusoidal
  config.model.norm = "post"  # post (as the seeds) | pre
  config.model.pooling = "mean"  # mean | max | attention | cls | last
  config.model.layer_norm_epsilon = 1e-6
  config.model.dtype = "float32"  # float32 | bfloat16 (compute dtype; parameters stay float32)
  # Token-embedding initialisation: "random" (Keras' uniform(-0.05, 0.05), as the seeds) or
  # "word2vec" (skip-gram vectors trained with gensim on the training split's text, validation
  # carved out, plus config.word2vec.unlabeled_split; textattn/word_vectors.py). Word tokenizer
  # only; built once per data + settings and cached in cache_dir.
  config.model.embedding_init = "random"

  # ---- word2vec (only with model.embedding_init="word2vec") ----------------------------------
  config.word2vec = ml_collections.ConfigDict()
  # A TFDS split of unlabelled text added to the corpus ("unsupervised" for imdb_reviews: 50,000
  # reviews without labels); "" = the training split's text only (always for local files).
  # Labelled splits are refused: validation and test text never reach the vectors.
  config.word2vec.unlabeled_split = ""
  config.word2vec.epochs = 5
  config.word2vec.window = 5
  config.word2vec.min_count = 2
  config.word2vec.negative = 5
  config.word2vec.seed = 0
  # "init": rescale the pretrained rows to the random initialiser's standard deviation (so only
  # their directions are new); "raw": word2vec's own scale (about 10x larger).
  config.word2vec.scale = "init"

  # ---- Pretraining (textattn/pretrain.py) -------------------------------------------------
  # "mlm": a fresh run first trains the embedding and encoder blocks as a masked language model
  # on the training split's text (validation carved out) plus pretrain.unlabeled_split, then
  # fine-tunes the classifier from them. "" = none. Cached in cache_dir per data + settings.
  config.pretrain = ml_collections.ConfigDict()
  config.pretrain.objective = ""
  # A TFDS split of unlabelled text added to the corpus ("unsupervised" for imdb_reviews);
  # "" = the training split's text only (always for local files). Labelled splits are refused.
  config.pretrain.unlabeled_split = ""
  config.pretrain.num_steps = 2000
  config.pretrain.batch_size = 32
  # Linear warm-up then cosine decay over num_steps; the optimizer's other settings are
  # config.optimizer's (name, betas, eps, weight decay, clipping).
  config.pretrain.learning_rate = 1e-3
  config.pretrain.warmup_steps = 200
  # BERT's masking: this fraction of each text's tokens is predicted (at least 1, at most
  # max_predictions): 80% replaced by [MASK], 10% by a random token, 10% kept.
  config.pretrain.mask_rate = 0.15
  config.pretrain.max_predictions = 64
  config.pretrain.seed = 0  # the pretraining's own seed (init, masking, order), not config.seed

  # ---- Optimiser --------------------------------------------------------------
  config.optimizer = ml_collections.ConfigDict()
  # adam | adamw | rmsprop | keras_adam. "keras_adam" is Adam as the seed Keras model's optimizer
  # computes it (Keras 3, TensorFlow backend): eps added before the bias correction, and the
  # token table's second moment fed each token's per-occurrence squared gradients, summed, not
  # the square of the summed gradient, so a token seen n times in a batch takes up to sqrt(n)
  # times Adam's step (textattn/train.py, scale_by_keras_adam). No clipping or weight decay.
  config.optimizer.name = "adam"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.schedule = "constant"  # constant | cosine (both after linear warm-up)
  config.optimizer.warmup_steps = 0
  config.optimizer.weight_decay = 0.0
  config.optimizer.grad_clip_norm = 0.0  # 0 = no clipping
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-7  # Keras Adam's default, as in the seed
  # Token-embedding table update: "dense" (every row, every step: the optimizer as written) or
  # "lazy" (only the rows of ids in the batch, moments included, as TF's LazyAdam; absent rows
  # keep their values and moments). Lazy changes the optimizer's semantics; it avoids the
  # [vocab, embed] gradient and full-table update, but at vocab 20,000 on a 2-core CPU it was
  # measured slower than dense (experiments/RESULTS.md), so it is off by default.
  config.optimizer.embedding_update = "dense"
  # Exponential moving average of the parameters, used for every evaluation, the best-checkpoint
  # choice and the test report: 0 = off (the parameters themselves). At update t the decay is
  # min(ema_decay, (1 + t) / (10 + t)) (TF's ExponentialMovingAverage with num_updates): it
  # reaches 0.99 only after ~890 updates and 0.999 after ~9,000, so on a run of ~2,000 steps
  # 0.99 and 0.999 behave alike (about the last 150-250 steps averaged).
  config.optimizer.ema_decay = 0.0
  # Label smoothing of the training loss (optax.smooth_labels); 0 = plain cross-entropy.
  # The logged train/loss is then the smoothed loss; evaluation losses are always plain
  # cross-entropy.
  config.optimizer.label_smoothing = 0.0

  # ---- Loop -----------------------------------------------------------------
  config.seed = 0
  config.batch_size = 32  # global batch size; must divide by the number of devices
  # CPU only: split the host CPU into this many JAX devices, so the batch is data-parallel over
  # the cores (each device runs its share of the step on its own thread). 0 = JAX's default
  # (one CPU device, or XLA_FLAGS' --xla_force_host_platform_device_count). Read by
  # textattn.main and by textattn.benchmark --mode=train_step before JAX starts; no effect on
  # GPU/TPU devices.
  config.num_cpu_devices = 0
  # Extra XLA flags ("--xla_name=value ..."), given to the compilation of the train and eval
  # steps (jax.jit compiler_options; also by the benchmark's train_step mode), e.g.
  # "--xla_cpu_experimental_ynn_fusion_type=", which turns off XLA:CPU's YNNPACK fusions
  # (see experiments/RESULTS.md). Empty = none.
  config.xla_flags = ""
  # Bit-for-bit reproducible steps on every backend (what exact resume promises). CPUs are
  # deterministic already; on GPUs this compiles the steps with --xla_gpu_deterministic_ops,
  # without which two runs of the same config differed in almost every parameter after 60
  # steps (atomic scatter-adds), at a cost of 1.4-1.8x in train-step time on an H100
  # (experiments/RESULTS.md, "On a GPU"). False = XLA's faster default on GPUs.
  config.deterministic = True
  config.eval_batch_size = 256
  config.num_epochs = 2
  config.num_train_steps = -1  # > 0 overrides num_epochs
  config.log_every_steps = 100
  config.eval_every_steps = 0  # 0 = once per epoch
  config.checkpoint_every_steps = 0  # 0 = once per epoch (and always at the end)
  # Parameters for the final test report: "best" (the checkpoint with the best validation
  # accuracy; needs eval_split="validation") or "last".
  config.final_params = "best"
  config.keep_checkpoints = 2  # the latest K are kept, plus the best by validation accuracy
  return config
