"""The e3 recipe: see README.md in this folder."""
