import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded randomness: never all zeros or ones (style C28a)."""
    return np.random.default_rng(1234)
