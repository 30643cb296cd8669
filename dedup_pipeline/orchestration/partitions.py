"""Hourly UTC partitions per dataset, keyed like `2026-11-01-05:00` (design.md D1)."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.hours import PARTITION_FMT


def hourly_partitions(ds: DatasetConfig) -> dg.HourlyPartitionsDefinition:
    return dg.HourlyPartitionsDefinition(start_date=ds.start, timezone="UTC", fmt=PARTITION_FMT)
