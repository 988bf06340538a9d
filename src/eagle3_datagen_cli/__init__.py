"""The ``eagle3-datagen`` command line: it starts the flows of ``eagle3_datagen_flows`` and
reads their runs back from the Prefect API. The flows never import it."""
