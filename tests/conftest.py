import os

from hypothesis import settings

pytest_plugins = ["pytester"]

# CI runs derandomized: the same examples every run, so a red build is reproducible.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
