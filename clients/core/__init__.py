"""The bottom layer every other layer reads: config schema and resolution, registries, errors,
seeding and the strategy-wrapper base. It imports nothing else of flowerbed (import-linter
contract ``core is the bottom layer`` in pyproject.toml).
"""
