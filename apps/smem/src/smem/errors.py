"""Errors the API maps to status codes."""


class NotFound(LookupError):
    status = 404


class Conflict(ValueError):
    status = 409
