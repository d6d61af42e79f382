from kevin.records.verdicts import feedback_line as feedback_line  # noqa: F401  (moved to the records layer)
