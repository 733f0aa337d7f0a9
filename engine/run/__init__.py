"""The run stage: a plan's steps executed as processes (legs, collectors, removals), their output
harvested line by line, and the evidence written as it grows."""
