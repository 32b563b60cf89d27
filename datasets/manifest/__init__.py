"""The ``manifest`` source: a table of samples (CSV, TSV, Parquet, or a ``path label`` list), one row each."""
