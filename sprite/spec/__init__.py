"""Reading input: YAML documents, the job spec, site profiles, the scheduler block, secrets."""
