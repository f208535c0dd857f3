"""Durable storage of responses.

``base`` is the contract; ``sql`` implements it on SQLite or PostgreSQL; ``factory``
picks the database from the settings. Nothing is imported here, so that depending on the
contract does not load the database drivers.
"""
