"""Moved to ``harness.integrations.measured_loop``: this old import path works for one more release, with a DeprecationWarning."""

import sys
import warnings

import harness.integrations.measured_loop as _moved

warnings.warn("harness.measured_loop moved to harness.integrations.measured_loop; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
