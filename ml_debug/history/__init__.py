"""Each node's history in SQLite: check results, drains and resumes, incidents that name a node."""
