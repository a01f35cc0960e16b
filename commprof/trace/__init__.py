"""The trace: one schema, the per-rank journal, Parquet files, metadata.

This package is the bottom of commprof: it imports nothing else of commprof,
and its modules import pyarrow only inside the functions that need it, so a
recorded rank can use the schema and the journal without paying for it.

- :mod:`.schema`   columns, categories, the ``Event`` row, version checks
- :mod:`.journal`  a rank's crash-safe binary journal: naming, writing
  (pure Python), reading, salvage of torn blocks
- :mod:`.parquet`  writing traces, reading them whole or in chunks of ranks,
  conforming older files
- :mod:`.metadata` run and rank metadata (encoded into the Parquet footer)
- :mod:`.files`    atomic writes; :mod:`.values` missing / plain cell values
"""
