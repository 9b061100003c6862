import os

import numpy as np
import pytest
from hypothesis import settings

# Property tests draw the same examples on every run ("ci", the default): a red CI means a
# change broke something, not that a new example turned up. HYPOTHESIS_PROFILE=explore draws
# new ones each run, to look for bugs (fix what it finds, then add the example as a test).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
