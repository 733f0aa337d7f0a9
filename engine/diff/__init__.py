"""`engine diff`: what a spec change means, mode by mode, for the reviewer of a PR.

    engine diff OLD.yaml NEW.yaml                     two files
    engine diff specs/p4_soak.yaml --base origin/main the spec at a git revision vs the working tree
    engine diff ... --evidence runs/p4_soak-soak-X    every touched check judged old and new on a saved run
    engine diff ... --markdown -                      Markdown for a PR comment / job summary

Both sides are loaded, merged (extends/include at their own revision), validated and resolved into
a plan for every mode (and every target a `switch:` lists for a value a variable sets) with the SAME
fixed builtins and no other environment, so only the spec can make a difference: run_dir, run_id or
the reviewer's shell never show up as changes. Plans are then compared field by field: JMESPath is compared by syntax tree and prose by words, so reordering keys
or reformatting YAML gives an empty diff.

The package, in the order the data flows: `model` (what a diff is made of), `sides` (loading both
sides, with git), `rename` (a step renamed throughout, compared as one change), `variants` (each mode
again under every target a variable picks), `compare`, `operands` and `strictness` (which way a changed
check moved), `coverage` (how much of a run it reads), `saved_run` (a saved run against the change: each
touched check old and new, with its numbers), `trust` (what a saved run ran, never taken from the change
itself), `reach` (where a gate runs at all), `overrides` (values a change hands to the environment),
`risk` (what `engine review` asks approval for), `render` (text and Markdown), `command` (`engine diff`
itself), `review` (`engine review`: every spec of a change, its saved run re-checked, its risks);
`phrases` words values for all of them.

Exit codes: 0 no semantic change, 1 a semantic change, 2 an invalid spec on either side or bad usage.
"""
