"""Reading settings from the environment: one typed parser per kind of value."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def env_str(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    return default if value is None or value == "" else value


def env_bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingsError(f"{name} must be true or false, got {value!r}")


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {value!r}") from None


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {value!r}") from None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """`5s`, `1m`, `2h`, `1d`, `250ms` or bare seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise SettingsError(f"not a duration: {text!r} (use e.g. 5s, 1m, 2h)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_schedule(text: str) -> tuple[float, ...]:
    """`5s,1m,5m` -> (5.0, 60.0, 300.0)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise SettingsError("a retry schedule needs at least one step")
    return tuple(parse_duration(p) for p in parts)


#: The two modes; production refuses dev-only settings and dev defaults.
MODES = ("dev", "production")


def env_mode(env: Mapping[str, str]) -> str:
    """SETTLE_ENV: `dev` (default) or `production`."""
    mode = env_str(env, "SETTLE_ENV", "dev") or "dev"
    if mode not in MODES:
        raise SettingsError("SETTLE_ENV must be dev or production")
    return mode


#: Dev-only secret key, refused in production.
DEV_SECRET_KEY = "settle-dev-secret-key-not-for-production"
#: The command the docs and the error give for making a key (32 random bytes, base64url).
MAKE_SECRET_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
_HEX_KEY = re.compile(r"[0-9a-fA-F]+")


def secret_key_weakness(key: str) -> str | None:
    """Why `key` is not at least 32 random bytes as text, or None when it may be.

    A key must be as long as 32 random bytes written in hex (64 digits) or base64
    (43 characters), and not be the dev default or a visibly repetitive string (fewer
    distinct characters than random text of that length would all but surely have).
    No check can tell a random-looking phrase from a random key: make it with
    MAKE_SECRET_KEY.
    """
    if key.strip() == DEV_SECRET_KEY:
        return "is the dev default"
    hex_only = bool(_HEX_KEY.fullmatch(key))
    shortest, fewest = (64, 10) if hex_only else (43, 16)
    if len(key) < shortest:
        form = "64 hex digits" if hex_only else "43 characters"
        return f"is shorter than 32 random bytes ({form})"
    if len(set(key)) < fewest:
        return f"has only {len(set(key))} distinct characters: it is not random"
    return None


def env_secret_key(env: Mapping[str, str], mode: str) -> str:
    """SETTLE_SECRET_KEY: required and strong in production; the dev default otherwise."""
    key = env_str(env, "SETTLE_SECRET_KEY")
    if mode != "production":
        return key or DEV_SECRET_KEY
    problem = "is required in production" if not key else secret_key_weakness(key)
    if problem:
        raise SettingsError(
            f"SETTLE_SECRET_KEY {problem}; it must be at least 32 random bytes. "
            f"Make one with: {MAKE_SECRET_KEY}"
        )
    assert key is not None
    return key


#: Name of the data dir `settle dev` makes in the directory it is started from.
DATA_DIR_NAME = ".settle"


def data_dir(env: Mapping[str, str], cwd: Path | None = None) -> Path:
    """SETTLE_DATA_DIR, else the nearest `.settle` in the working directory or its parents.

    Like git finding `.git`: a command run anywhere inside a project uses the data dir
    `settle dev` made at its top. With none found, `./.settle` (where `settle dev` makes
    one); other commands then say that none exists (`services.cli`).
    """
    explicit = env_str(env, "SETTLE_DATA_DIR")
    if explicit:
        return Path(explicit)
    here = (cwd or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / DATA_DIR_NAME
        if candidate.is_dir():
            return candidate
    return here / DATA_DIR_NAME


def default_database_url(env: Mapping[str, str]) -> str:
    """SETTLE_DATABASE_URL, else (dev only) the embedded PostgreSQL of the data dir.

    The embedded server is named, not started: it starts when a process first connects
    (shared.db resolves the URL), so reading settings has no side effect.
    """
    from shared import embedded_postgres

    url = env_str(env, "SETTLE_DATABASE_URL")
    if url:
        return url
    if env_mode(env) == "production":
        raise SettingsError("SETTLE_DATABASE_URL is required in production (a PostgreSQL URL)")
    return embedded_postgres.url_for(data_dir(env))


def environ() -> Mapping[str, str]:
    """The process environment (a function so tests can pass their own mapping)."""
    return os.environ
