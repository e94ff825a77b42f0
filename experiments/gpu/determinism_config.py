"""The classification defaults (textattn.defaults.classification()), for determinism.py's runs:
what configs/default.py held before the defaults moved into textattn/defaults.py."""

from textattn import defaults


def get_config():
  return defaults.classification()
