"""The asrr recipe: see README.md in this folder."""
