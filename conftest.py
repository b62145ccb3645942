"""Root conftest: only what the repository's own tests need."""
