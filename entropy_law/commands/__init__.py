"""Sub-commands of the ``entropy-law`` CLI: one module each, exposing ``register(subparsers)``.

``entropy_law.cli`` discovers every module here, so adding a command never edits the CLI itself.
"""
