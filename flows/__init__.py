"""Prefect flows: the parent run and one subflow per partition. Logic lives in eagle3_datagen."""
