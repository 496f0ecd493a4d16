"""Moved to ``harness.integrations.pytest_plugin``: this old import path works for one more release, with a DeprecationWarning."""

import sys
import warnings

import harness.integrations.pytest_plugin as _moved

warnings.warn("harness.pytest_plugin moved to harness.integrations.pytest_plugin; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
