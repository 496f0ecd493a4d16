"""Moved to ``harness.integrations.asv_helpers``: this old import path works for one more release, with a DeprecationWarning."""

import sys
import warnings

import harness.integrations.asv_helpers as _moved

warnings.warn("harness.asv_helpers moved to harness.integrations.asv_helpers; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
