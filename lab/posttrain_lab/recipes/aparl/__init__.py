"""The aparl recipe: see README.md in this folder."""
