"""Small shared helpers: atomic file I/O, typed config loading, progress bars, tables."""
