"""The Dagster layer: partitions, resources, assets and jobs. It calls the engine; no Spark work
happens while definitions load (the session starts inside a run)."""
