"""What people read: terminal tables, PNG charts, RUNS.md rows and the generated flag reference."""
