"""gunicorn entry: `services.core.wsgi:app`, configured from the environment."""

from services.core.app import create_app

app = create_app()
