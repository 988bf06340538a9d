"""`eagle3-datagen select`: a new dataset of the conversations a rule ranks first."""
