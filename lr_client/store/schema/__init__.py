"""The store's schema: its tables, its migrations and their lifecycle."""
