"""The spec stage: a YAML spec loaded with its locations, its values resolved per mode, validated beyond
the schema, and planned into the steps and checks a run executes."""
