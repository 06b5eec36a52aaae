"""gunicorn entry: `services.notifier.wsgi:app`, configured from the environment.

The API hands the deliveries it makes (test, replay, recover) to the workers through
RabbitMQ when SETTLE_AMQP_URL is set; without it the sweeper sends them.
"""

from services.notifier.app import create_app
from services.notifier.config import NotifierConfig
from services.notifier.delivery_engine import api_context

app = create_app(context=api_context(NotifierConfig.from_env()))
