"""Moved to ``harness.specs.own_trainer``: this old import path works for one more release, with a DeprecationWarning."""

import sys
import warnings

import harness.specs.own_trainer as _moved

warnings.warn("harness.own_trainer moved to harness.specs.own_trainer; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
