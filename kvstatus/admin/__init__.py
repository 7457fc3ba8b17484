"""Namespace tools over the core: scan, stats, watch, doctor and the ACL recipe."""
