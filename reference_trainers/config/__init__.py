"""The typed training configuration: its schema, config files and overrides, the flag registry, and resolve
(``auto`` values and every flag rule, read from the registry)."""
