"""The duca recipe: see README.md in this folder."""
