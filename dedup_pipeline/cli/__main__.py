"""`python -m dedup_pipeline.cli …`, as the `dedup-pipeline` command."""

from dedup_pipeline.cli import main

main()
