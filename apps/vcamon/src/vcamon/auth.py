"""Bearer tokens (the page's, each agent's): one line in a file, compared in constant time."""

from __future__ import annotations

import hmac
import re

# URL- and cookie-safe, long enough not to be guessed (e.g. `openssl rand -hex 32`).
TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,}")
MAX_FILE_CHARS = 4096


def check_token(token):
    """The token itself, or a ValueError that says what a token must look like."""
    if not TOKEN.fullmatch(token or ""):
        raise ValueError("a token is at least 16 of A-Z a-z 0-9 . _ ~ - (e.g. `openssl rand -hex 32`)")
    return token


def read_token_file(path):
    """The token kept in path (one line). Missing, unreadable, empty or malformed: a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_FILE_CHARS + 1)
    except OSError as exc:
        raise ValueError("token file %s: %s" % (path, exc.strerror or exc)) from None
    except UnicodeDecodeError:
        raise ValueError("token file %s: not a line of text" % path) from None
    token = text.strip()
    if not token:
        raise ValueError("token file %s is empty" % path)
    try:
        return check_token(token if len(text) <= MAX_FILE_CHARS else "")
    except ValueError as exc:
        raise ValueError("token file %s: %s" % (path, exc)) from None


def same(given, token):
    """given (from a request; None when absent) is token, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def bearer(headers):
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, given = (headers.get("Authorization") or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None
