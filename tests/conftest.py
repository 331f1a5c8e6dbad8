"""Repository-wide test configuration."""

pytest_plugins = ["pytester"]
