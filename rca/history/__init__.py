"""History: read-only git revisions, and what a change or a run of commits did to the wiring."""
