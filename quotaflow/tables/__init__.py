"""Tables in and out: rows of CSV, Parquet and JSONL files (or a program's rows) made
into OpenAI Batch lines through a prompt template, and a job's answers joined back to
its rows as a Parquet or CSV table. Plain data conversion, streamed a batch of rows at
a time: no database, no server; `quotaflow submit`, `quotaflow run`, `quotaflow results`
and the Python client call it on each side of the JSONL that ingest reads.
"""

# What a job made from a table keeps in its metadata to find its rows again: the table's
# path on the submitting machine, and its id column (none: rows are numbered from 1).
INPUT_KEY = "quotaflow_input"
ID_COLUMN_KEY = "quotaflow_id_column"
