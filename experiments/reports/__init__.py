"""Each paper launcher's own tables and figures, read from its finished runs."""
