"""The show stage: a verdict for people (terminal table, JUnit, Markdown, one HTML page) and the plots
drawn from the evidence (SVG, Mermaid)."""
