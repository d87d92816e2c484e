# The fixture from the tree's `stockade.testing` (an installed package registers it by
# its pytest11 entry point).
pytest_plugins = ["stockade.testing"]
