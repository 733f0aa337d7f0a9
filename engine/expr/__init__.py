"""Expressions: the JMESPath functions a spec may call and the tracer that evaluates an expression over a
document, recording what was missing and the value of every sub-expression it will explain."""
