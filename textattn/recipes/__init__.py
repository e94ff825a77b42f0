"""Recipes built on the training loop that are not the core: MLM pretraining, word2vec start."""
