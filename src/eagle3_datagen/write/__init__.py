"""Stage 6, write: records, journals, Parquet shards and markers, the manifest, exports."""
