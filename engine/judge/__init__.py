"""The judge stage: checks evaluated over the evidence, the verdict and exit code, and the re-check of a
saved run against the spec as it is now."""
