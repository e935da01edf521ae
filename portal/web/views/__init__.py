"""Page views, split by who uses them: provider, researcher, admin dashboard."""
