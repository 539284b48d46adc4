"""Suite-wide settings: property tests have no per-example deadline, since CI machines are shared and slow."""

from hypothesis import settings

settings.register_profile("rmpd", deadline=None)
settings.load_profile("rmpd")
