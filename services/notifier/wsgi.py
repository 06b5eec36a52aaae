"""gunicorn entry: `services.notifier.wsgi:app`, configured from the environment.

The API hands the deliveries it makes (test, replay, recover) to the workers through
RabbitMQ when SETTLE_AMQP_URL is set; without it the sweeper sends them.
"""

from services.notifier.app import create_app
from services.notifier.config import NotifierConfig
from services.notifier.context import NotifierContext
from services.notifier.engine import wire_enqueue

context = NotifierContext.build(NotifierConfig.from_env())
wire_enqueue(context)
app = create_app(context=context)
