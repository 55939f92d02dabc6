"""The dapo recipe: see README.md in this folder."""
