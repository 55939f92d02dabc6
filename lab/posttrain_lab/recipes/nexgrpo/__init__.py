"""The nexgrpo recipe: see README.md in this folder."""
