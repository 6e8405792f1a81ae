"""Test-wide settings.

Property tests (hypothesis) run derandomized by default: the README's test command (and CI)
tries the same examples every time, so a red run is a regression, never a new random draw.
``HYPOTHESIS_PROFILE=explore`` searches at random (1000 examples where a test sets no number), to hunt for
new counterexamples (add each one found as an ``@example``).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
